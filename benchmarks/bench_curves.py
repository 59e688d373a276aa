"""Time per point and per step beyond the straight line, beside ``barrier``'s per point.

On one pair of models and one test set (an MLP 784-256-256-10 on 2,000 random inputs of
MNIST's shape, or a ResNet20 x1 with BatchNorm on 256 inputs 3x32x32), interleaved and
repeated so that other load on a shared machine hits every measurement alike:

- ``barrier / point``: an 11-point linear path (``lmckit.evaluate_path``, what
  ``lmckit barrier`` runs), divided by 11;
- ``landscape / point``: a 7x7 plane through three models (``lmckit.paths.evaluate_plane``,
  what ``lmckit landscape`` runs: 49 grid points, each model at its coordinates and as
  itself), divided by its 55 evaluations;
- ``bezier / step``: ``lmckit.paths.fit_curve`` (one quadratic Bezier point, forward and
  backward on one batch of 128), per optimiser step;
- ``neb / step``: ``lmckit.paths.fit_band`` with 3 pivots and no insertion (forward and
  backward at every pivot, forward at both ends, the nudged force), per step; and per
  pivot and step.

BatchNorm networks get a BatchNorm reset at every path and plane point, as the commands
do (on 2 batches of training inputs). Medians over the repeats.

Run: .venv/bin/python benchmarks/bench_curves.py [--repeats 3] [--threads 1]
     [--cases mlp resnet20]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from lmckit.data import Dataset, batches
from lmckit.measure._evaluate import evaluate_path
from lmckit.merging._merge import has_batchnorm, reset_batchnorm
from lmckit.models import create_model
from lmckit.paths import BandConfig, evaluate_plane, fit_band, fit_curve, plane_frame
from lmckit.paths._plane import plane_axes
from lmckit.training._train import TrainConfig

STEPS = 20
PIVOTS = 3
RESOLUTION = 7

CASES: dict[str, tuple[str, dict, tuple[int, ...], int]] = {
    "mlp": ("mlp", dict(in_features=784, hidden=[256, 256], out_features=10), (784,), 2000),
    "resnet20": ("resnet20", dict(in_channels=3, num_classes=10, width_mult=1), (3, 32, 32), 256),
}


def _data(shape: tuple[int, ...], n: int) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return Dataset("random", x, y, x, y, 10)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _per_step(fit: Callable[[], Any]) -> float:
    """Seconds per optimiser step of a fit (it must take :data:`STEPS` steps)."""
    start = time.perf_counter()
    curve = fit()
    seconds = time.perf_counter() - start
    assert curve.steps == STEPS, f"{curve.steps} steps, not {STEPS}"
    return seconds / STEPS


def _runs(case: str) -> dict[str, Callable[[], float]]:
    """Each measurement as a callable returning seconds per unit."""
    name, kwargs, shape, n = CASES[case]
    model, a = create_model(name, seed=0, **kwargs)
    b, c = (create_model(name, seed=s, **kwargs)[1] for s in (1, 2))
    data = _data(shape, n)
    test = partial(batches, data.x_test, data.y_test, 500)
    stats = [x for x, _ in batches(data.x_train, data.y_train, 128, limit=2)]
    reset = has_batchnorm(model)

    def line_prepare(p: dict, _t: float) -> dict:
        return reset_batchnorm(model, p, stats)

    frame = plane_frame(a, b, c, names=[k for k, _ in model.named_parameters()])
    xs, ys = plane_axes(frame, RESOLUTION, 0.2)
    config = TrainConfig(epochs=1000, batch_size=128, optimizer="sgd", lr=0.01, max_steps=STEPS)
    prepare = line_prepare if reset else None
    plane_prepare = (lambda p, _xy: line_prepare(p, 0.0)) if reset else None
    evaluations = RESOLUTION * RESOLUTION + 6
    return {
        "barrier / point": lambda: (
            _timed(lambda: evaluate_path(model, a, b, test, points=11, prepare=prepare)) / 11
        ),
        "landscape / point": lambda: (
            _timed(
                lambda: evaluate_plane(
                    model, [a, b, c], frame, test, xs=xs, ys=ys, prepare=plane_prepare
                )
            )
            / evaluations
        ),
        "bezier / step": lambda: _per_step(
            lambda: fit_curve(model, a, b, data, config, kind="bezier")
        ),
        "neb / step": lambda: _per_step(
            lambda: fit_band(model, a, b, data, config, BandConfig(pivots=PIVOTS, cycles=1))
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", nargs="+", default=["mlp", "resnet20"], choices=list(CASES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, {args.threads} thread(s), load {os.getloadavg()[0]:.1f}"
    )
    for case in args.cases:
        runs = _runs(case)
        times: dict[str, list[float]] = {k: [] for k in runs}
        for r in range(args.repeats):
            order = list(runs)
            order = order[r % len(order) :] + order[: r % len(order)]
            for key in order:
                times[key].append(runs[key]())
        median = {k: statistics.median(v) for k, v in times.items()}
        base = median["barrier / point"]
        bn = has_batchnorm(create_model(CASES[case][0], seed=0, **CASES[case][1])[0])
        print(f"\n{case} (BatchNorm reset at every point: {bn})")
        for key, value in median.items():
            print(f"  {key:<18} {value:8.4f} s   {value / base:6.2f}x barrier's per point")
        print(f"  neb / pivot-step   {median['neb / step'] / PIVOTS:8.4f} s")
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
