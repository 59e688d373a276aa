"""Weight matching from the identity vs from the anchored start, on several model families.

The anchored start (:mod:`lmckit.aligners._weight.anchored`) is weight matching's default; it
must not make any family worse. For each pair this trains (and caches under OUT) two
models with lmckit's trainer, aligns B to A by weight matching from both starts (and with
``start="best"``, which picks one by the midpoint's training loss), and
prints the test loss barrier (11 points; BatchNorm statistics reset at each point where
the model has BatchNorm), the objective ``sum_p <A_p, T(B)_p>`` reached, the sweeps and
the wall time. Families: MLPs and a VGG and a ResNet20 with BatchNorm on MNIST (first
8,000 / last 2,000 of the 10k test images), a ViT on MNIST and a character-level GPT-2
(zoo models; orthogonal residual stream in circuit form, and permutations only).

    nice .venv/bin/python scripts/anchored_start_families.py /work/runs/reference/families \
        --data-root /work/shared/data
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import torch

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.aligners._weight.objective import total_objective
from lmckit.data import Dataset, load_mnist
from lmckit.data._token_stats import EMBEDDING, LM_HEAD, token_counts
from lmckit.formats import _checkpoint as checkpoint
from lmckit.forms._recipe import aligned_form
from lmckit.measure._measure import EvalSettings, measure_path
from lmckit.models import create_model
from lmckit.symmetry._transform import Orthogonal, Permutation, apply
from lmckit.training._train import TrainConfig, fit


def _mnist(root: Path) -> Dataset:
    return load_mnist(root / "mnist")


def _chars(root: Path, chars: int = 100_000, block: int = 64) -> Dataset:
    text = (root / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:chars]
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text])
    n = len(ids) // (block + 1)
    blocks = ids[: n * (block + 1)].reshape(n, block + 1)
    test = n // 10
    x, y = blocks[:, :-1], blocks[:, 1:]
    return Dataset("chars", x[:-test], y[:-test], x[-test:], y[-test:], num_classes=len(vocab))


@dataclasses.dataclass(frozen=True)
class Family:
    """A pair to train: zoo model, constructor arguments, data, training, forms to align."""

    model: str
    kwargs: dict
    data: Callable[[Path], Dataset]
    train: TrainConfig
    forms: tuple[tuple[str | None, bool], ...] = ((None, False),)  # (symmetry, circuits)
    masks: bool = False


ADAM = TrainConfig(epochs=5, batch_size=128, optimizer="adam", lr=1e-3)
FAMILIES = {
    "mlp-mnist": Family(
        "mlp", {"in_features": 784, "hidden": [256] * 3, "out_features": 10}, _mnist, ADAM
    ),
    "mlp6-mnist": Family(
        "mlp", {"in_features": 784, "hidden": [128] * 6, "out_features": 10}, _mnist, ADAM
    ),
    "vgg-mnist": Family(
        "vgg",
        {
            "in_channels": 1,
            "num_classes": 10,
            "image_size": 28,
            "widths": (16, "M", 32, "M", 64, 64, "M"),
        },
        _mnist,
        TrainConfig(epochs=3, batch_size=128, optimizer="sgd", lr=0.05, weight_decay=5e-4),
    ),
    "resnet20-mnist": Family(
        "resnet20",
        {"in_channels": 1, "num_classes": 10},
        _mnist,
        TrainConfig(epochs=2, batch_size=128, optimizer="sgd", lr=0.05, weight_decay=5e-4),
    ),
    "vit-mnist": Family(
        "vit",
        {
            "image_size": 28,
            "patch_size": 7,
            "in_channels": 1,
            "num_classes": 10,
            "width": 64,
            "depth": 2,
            "heads": 4,
            "mlp_dim": 128,
        },
        _mnist,
        TrainConfig(
            epochs=8, batch_size=128, optimizer="adamw", lr=1e-3, weight_decay=0.01, warmup=0.05
        ),
        forms=(("permutation", True), ("orthogonal", True)),
    ),
    "gpt2-chars": Family(
        "gpt2",
        {"vocab_size": 0, "n_layer": 2, "n_head": 2, "n_embd": 32, "n_inner": 128, "context": 64},
        _chars,
        TrainConfig(
            epochs=2, batch_size=32, optimizer="adamw", lr=3e-3, weight_decay=0.01, warmup=0.05
        ),
        forms=(("permutation", True), ("orthogonal", True)),
        masks=True,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="cache of the trained pairs")
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--only", nargs="*", default=None, help="families to run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name, fam in FAMILIES.items():
        if args.only and name not in args.only:
            continue
        data = fam.data(args.data_root)
        kwargs = dict(fam.kwargs)
        if "vocab_size" in kwargs:
            kwargs["vocab_size"] = data.num_classes
        models = []
        for seed in (0, 1):
            where = args.out / name / f"seed{seed}"
            if not (where / checkpoint.CONFIG_FILE).exists():
                module, init = create_model(fam.model, seed=seed, **kwargs)
                trained = fit(module, init, data, fam.train, seed=seed, progress=False)
                checkpoint.save(where, module, trained.params)
            models.append(checkpoint.load(where))
        (ca, cb) = models
        masks = None
        if fam.masks:
            seen = token_counts(data)[0] > 0
            # a tied LM head is one parameter with the embedding
            masks = {k: seen for k in (EMBEDDING, LM_HEAD) if k in ca.params}
        naive = measure_path(ca.module, ca.params, cb.params, data, EvalSettings())
        print(f"{name}: naive {naive.barrier_loss:.4f}", flush=True)
        for symmetry, circuits in fam.forms:
            form = aligned_form(
                ca.module, ca.params, cb.params, symmetry=symmetry, circuits=circuits
            )
            spec = form.spec
            if symmetry == "permutation" and circuits:
                spec = spec.with_groups(
                    **{s.name: Permutation() for s in spec if isinstance(s.group, Orthogonal)}
                )
            kind = ", permutations" if symmetry == "permutation" else ""
            label = f"{name} [{form.form or 'as trained'}{kind}]"
            for start in ("identity", "anchored", "best"):
                begin = time.perf_counter()
                config = WeightMatchingConfig(start=start)
                res = weight_matching(spec, form.a, form.b, config, model=form.module,
                                      data=data, row_masks=masks)  # fmt: skip
                seconds = time.perf_counter() - begin
                moved = apply(spec, form.b, res.transform)
                path = measure_path(form.module, form.a, moved, data, EvalSettings())
                objective = total_objective(spec, form.a, form.b, res.transform)
                print(
                    f"{label} {start:>9}: barrier {path.barrier_loss:.4f}  objective "
                    f"{objective:.6g}  sweeps {res.iterations}  "
                    f"{seconds:.1f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
