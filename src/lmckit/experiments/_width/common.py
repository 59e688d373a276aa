"""What the width experiments share: MNIST subsets, the calibration split, MLP pairs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from lmckit.aligners import AlignmentResult, weight_matching
from lmckit.data import Dataset, batches
from lmckit.experiments._runner import Runner
from lmckit.measure._evaluate import PathResult
from lmckit.measure._plot import plot_paths
from lmckit.merging._calibration import evaluate_path_calibrated
from lmckit.models import ZooModel, create_model
from lmckit.symmetry._params import Params
from lmckit.training._train import TrainConfig

__all__ = [
    "BASE_WIDTH",
    "Batches",
    "CALIBRATION_FRACTION",
    "DEPTH",
    "MULTIPLIERS",
    "PAPER",
    "WEIGHT_DECAYS",
    "mlp_pair",
    "naive_and_matched",
    "split_test",
    "sweep",
]

PAPER = "arXiv 2510.08023 (Do We Really Need Permutations?); Garipov et al. 2018"
BASE_WIDTH = 32
DEPTH = 3
MULTIPLIERS = (1, 2, 4, 8, 16)
WEIGHT_DECAYS = (3e-3, 1e-4)
CALIBRATION_FRACTION = 0.2

Batches = Callable[[], Iterable[tuple[Tensor, Tensor]]]


def split_test(data: Dataset) -> tuple[Batches, Batches]:
    """Batches of the calibration part (first 20 %) and the evaluation part of the test split."""
    cut = int(CALIBRATION_FRACTION * len(data.x_test))
    x, y = data.x_test, data.y_test
    return (lambda: batches(x[:cut], y[:cut], 500)), (lambda: batches(x[cut:], y[cut:], 500))


def mlp_pair(
    run: Runner, data: Dataset, width: int, config: TrainConfig
) -> tuple[ZooModel, Params, Params]:
    """Two ``784 -> width x DEPTH -> 10`` ReLU MLPs, seeds ``seed`` and ``seed + 1``."""
    module, a, b = run.train_pair(
        f"mlp-w{width}-wd{config.weight_decay:g}-{config.optimizer}",
        lambda seed: create_model(
            "mlp", seed=seed, in_features=784, hidden=[width] * DEPTH, out_features=10
        ),
        data,
        config,
    )
    return module, a, b  # type: ignore[return-value]


def naive_and_matched(
    model: nn.Module,
    a: Params,
    b: Params,
    fit: Batches,
    held: Batches,
    *,
    points: int,
    seed: int,
    prepare: Callable[[Params, float], Params] | None = None,
    meta: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, PathResult], AlignmentResult]:
    """Calibrated paths from ``a`` to ``b`` as trained (``naive``) and weight-matched.

    Returns:
        The row entries every width sweep reports (end accuracies, naive and WM
        barriers, the naive midpoint's inverse temperature, the paths as JSON), the
        paths by method, and the weight-matching result.
    """
    spec = model.symmetry_spec()
    matching = weight_matching(spec, a, b, seed=seed)
    paths: dict[str, PathResult] = {}
    for method, other in (("naive", b), ("weight_matching", matching.apply(b))):
        paths[method] = evaluate_path_calibrated(
            model,
            a,
            other,
            fit,
            held,
            points=points,
            prepare=prepare,
            meta={"method": method, **(meta or {})},
        )
    naive, wm = paths["naive"], paths["weight_matching"]
    row = {
        "acc_a": naive.acc[0],
        "acc_b": naive.acc[-1],
        "naive_acc_barrier": naive.barrier_acc,
        "naive_loss_barrier": naive.barrier_loss,
        "wm_acc_barrier": wm.barrier_acc,
        "wm_loss_barrier": wm.barrier_loss,
        "naive_mid_inverse_temperature": naive.meta["inverse_temperature"][len(naive.t) // 2],
        "paths": {k: v.to_dict() for k, v in paths.items()},
    }
    return row, paths, matching


def sweep(
    run: Runner,
    multipliers: Sequence[float],
    measure: Callable[[float, float], dict[str, Any]],
    *,
    stage: Callable[[float, float], str],
    figure: Callable[[float, float, dict[str, Any]], tuple[str, str]],
) -> tuple[list[dict[str, Any]], list[Path]]:
    """Rows ``measure(weight_decay, multiplier)`` over :data:`WEIGHT_DECAYS` and
    ``multipliers``, each a cached stage named ``stage(wd, mult)``; for the widest model of
    every decay, the figure of its ``paths``, named and titled by ``figure(wd, mult, row)``."""
    rows, figures = [], []
    for wd in WEIGHT_DECAYS:
        for mult in multipliers:
            row = run.stage(stage(wd, mult), partial(measure, wd, mult))
            rows.append(row)
            if mult == multipliers[-1]:
                name, title = figure(wd, mult, row)
                paths = {k: PathResult.from_dict(v) for k, v in row["paths"].items()}
                where = run.ctx.out_dir / name  # lmckit's own experiment folder
                figures.append(plot_paths(paths, where, title=title, overwrite=True))
    return rows, figures
