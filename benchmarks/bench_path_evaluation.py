"""Path evaluation: one module with functional calls vs a model build per point.

Evaluates 11 points of the linear path between two models on 2,000 inputs, (a) with
``lmckit.evaluate_path`` — one module, each point run through
``torch.func.functional_call`` — and (b) the straightforward way: for each point,
construct a fresh module, ``load_state_dict`` the interpolated weights, run it.

Run: .venv/bin/python benchmarks/bench_path_evaluation.py
"""

from __future__ import annotations

import platform
import time

import torch
import torch.nn.functional as F

from lmckit.data import batches
from lmckit.evaluate import evaluate_path, linear_grid
from lmckit.models import ModelConfig, build_module, create_model
from lmckit.params import interpolate

CASES = {
    "MLP 784-512x3-10": (
        "mlp",
        dict(in_features=784, hidden=[512] * 3, out_features=10),
        (1, 28, 28),
    ),
    "ResNet20x1 (BN), 28x28": (
        "resnet20",
        dict(in_channels=1, num_classes=10, width_mult=1),
        (1, 28, 28),
    ),
}


REPEATS = 3


def naive(name: str, kwargs: dict, pa, pb, x, y) -> list[float]:
    losses = []
    for t in linear_grid(11):
        module = build_module(ModelConfig(name, kwargs))
        module.load_state_dict(interpolate(pa, pb, t))
        module.eval()
        total = 0.0
        with torch.no_grad():
            for xb, yb in batches(x, y, 500):
                total += float(F.cross_entropy(module(xb), yb, reduction="sum"))
        losses.append(total / len(x))
    return losses


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    print(
        f"machine: {platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}"
    )
    print(f"{'model':<26}{'lmckit (s)':>12}{'naive (s)':>12}{'ratio':>8}")
    for label, (name, kwargs, shape) in CASES.items():
        model, pa = create_model(name, seed=0, **kwargs)
        _, pb = create_model(name, seed=1, **kwargs)
        x = torch.randn(2000, *shape, generator=gen)
        y = torch.randint(0, 10, (2000,), generator=gen)
        ours_times, naive_times = [], []
        # alternate and keep the best of REPEATS, so warm-up and other load on the
        # machine do not favour either side
        for _ in range(REPEATS):
            start = time.perf_counter()
            res = evaluate_path(model, pa, pb, lambda x=x, y=y: batches(x, y, 500), points=11)
            ours_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            ref = naive(name, kwargs, pa, pb, x, y)
            naive_times.append(time.perf_counter() - start)
        ours, theirs = min(ours_times), min(naive_times)
        # same numbers either way
        assert max(abs(a - b) for a, b in zip(res.loss, ref, strict=True)) < 1e-4
        print(f"{label:<26}{ours:>12.3f}{theirs:>12.3f}{theirs / ours:>7.2f}x")


if __name__ == "__main__":
    main()
