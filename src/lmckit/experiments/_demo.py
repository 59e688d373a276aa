"""The demo: two MLPs on scikit-learn digits, barriers by alignment method."""

from __future__ import annotations

from collections.abc import Callable

from lmckit.data import load_digits
from lmckit.experiments._compare import compare_alignments
from lmckit.measure._evaluate import PathResult
from lmckit.measure._measure import EvalSettings
from lmckit.models import create_model
from lmckit.training._train import TrainConfig, fit

__all__ = ["run_demo"]

#: Hidden widths of the demo MLPs (64 -> 512 -> 512 -> 10, ReLU).
DEMO_HIDDEN = (512, 512)
_DEMO_TRAIN = TrainConfig(epochs=15, batch_size=64, optimizer="adam", lr=1e-3)


def run_demo(
    *,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = lambda _msg: None,
) -> dict[str, PathResult]:
    """Train MLPs with seeds ``seed`` and ``seed + 1`` on digits; compare alignments.

    Returns path results keyed by ``naive``, ``weight_matching``, ``activation_matching``
    (test split, 11 points).
    """
    data = load_digits(seed=0)
    trained = []
    for s in (seed, seed + 1):
        model, init = create_model(
            "mlp", seed=s, in_features=64, hidden=list(DEMO_HIDDEN), out_features=10
        )
        log(f"training MLP 64-{'-'.join(map(str, DEMO_HIDDEN))}-10 on digits, seed {s}")
        trained.append(fit(model, init, data, _DEMO_TRAIN, seed=s, progress=progress).params)
    log("aligning and measuring paths")
    return compare_alignments(
        model,
        model.symmetry_spec(),
        trained[0],
        trained[1],
        data,
        EvalSettings(),
        seed=seed,
        progress=progress,
    )
