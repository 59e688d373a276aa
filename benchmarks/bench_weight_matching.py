"""Weight matching: lmckit vs a straightforward per-layer loop.

Two independently initialised 784-4096-4096-4096-10 MLPs (the cost of a sweep does
not depend on training). Both implementations run the same number of sweeps over
the three hidden layers; we report seconds per sweep and their ratio, and check that
both reach the same objective.

The naive loop is what a short research script does: NumPy float64, dense
permutation matrices multiplied into the weights, every layer's cost rebuilt from
scratch.

Run: .venv/bin/python benchmarks/bench_weight_matching.py [--width 4096] [--sweeps 2]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from lmckit.align import WeightMatchingConfig, weight_matching
from lmckit.models import create_model


def naive_weight_matching(wa: list[np.ndarray], wb: list[np.ndarray], ba, bb, sweeps: int):
    """Per-layer loop with dense permutation matrices (float64)."""
    layers = len(wa) - 1  # hidden layers
    perms = [np.eye(wa[i].shape[0]) for i in range(layers)]
    for _ in range(sweeps):
        for i in range(layers):
            prev = perms[i - 1] if i > 0 else np.eye(wa[0].shape[1])
            nxt = perms[i + 1] if i + 1 < layers else np.eye(wa[-1].shape[0])
            # incoming weights with the previous layer's permutation applied
            w_in = wb[i] @ prev.T
            cost = wa[i] @ w_in.T + np.outer(ba[i], bb[i])
            # outgoing weights with the next layer's permutation applied
            w_out = nxt @ wb[i + 1]
            cost += wa[i + 1].T @ w_out
            rows, cols = linear_sum_assignment(cost, maximize=True)
            p = np.zeros_like(cost)
            p[rows, cols] = 1.0
            perms[i] = p
    total = 0.0
    for i in range(len(wa)):
        prev = perms[i - 1] if i > 0 else np.eye(wa[0].shape[1])
        nxt = perms[i] if i < layers else np.eye(wa[-1].shape[0])
        total += float(np.sum(wa[i] * (nxt @ wb[i] @ prev.T)))
        total += float(np.sum(ba[i] * (nxt @ bb[i])))
    return perms, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--sweeps", type=int, default=2)
    args = parser.parse_args()

    kwargs = dict(in_features=784, hidden=[args.width] * 3, out_features=10)
    model, pa = create_model("mlp", seed=0, **kwargs)
    _, pb = create_model("mlp", seed=1, **kwargs)
    spec = model.symmetry_spec()

    start = time.perf_counter()
    res = weight_matching(spec, pa, pb, WeightMatchingConfig(max_iter=args.sweeps))
    sweeps = res.iterations  # fewer than asked if it converged first
    ours = (time.perf_counter() - start) / sweeps
    ours_total = sum(d.objective_after for d in res.spaces.values())

    names = [f"layers.{i}" for i in range(3)] + ["head"]
    wa = [pa[f"{n}.weight"].double().numpy() for n in names]
    wb = [pb[f"{n}.weight"].double().numpy() for n in names]
    ba = [pa[f"{n}.bias"].double().numpy() for n in names]
    bb = [pb[f"{n}.bias"].double().numpy() for n in names]
    start = time.perf_counter()
    _, naive_total = naive_weight_matching(wa, wb, ba, bb, sweeps)
    naive = (time.perf_counter() - start) / sweeps

    print(
        f"machine: {platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, numpy {np.__version__}"
    )
    print(f"MLP 784-{args.width}x3-10, {sweeps} sweeps each")
    print(f"{'implementation':<28}{'s / sweep':>12}")
    print(f"{'lmckit weight_matching':<28}{ours:>12.2f}")
    print(f"{'naive per-layer loop':<28}{naive:>12.2f}")
    print(f"speed-up: {naive / ours:.2f}x")
    print(
        f"(objective after matching — lmckit, per-space sums: {ours_total:.6g}; "
        f"naive, whole network: {naive_total:.6g})"
    )


if __name__ == "__main__":
    main()
