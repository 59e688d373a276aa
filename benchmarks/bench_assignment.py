"""Linear assignment on weight matching's own cost matrices: lapx's JV vs SciPy.

Runs lmckit's weight matching on two MLPs 64 -> H x3 -> 10 (random initialisation,
seeds 0 and 1) and keeps every ``--every``-th similarity handed to the assignment
solver; then solves each kept matrix with both backends, alternating which goes first,
and checks that they reach the same total. Prints the seconds per matrix and the totals.

Run: ``python benchmarks/bench_assignment.py [--width 2048] [--every 1] [--threads 2]``
(needs ``lapx``: ``pip install 'lmckit[fast]'``).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from lmckit.aligners import weight_matching
from lmckit.groups import _assignment
from lmckit.models import create_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lapjvr = _assignment._lapjvr
    if lapjvr is None:
        raise SystemExit("lapx is not installed: pip install 'lmckit[fast]'")

    kept: list[np.ndarray] = []
    solve = _assignment._pairs
    calls = 0

    def keep(sim: torch.Tensor):
        nonlocal calls
        if calls % args.every == 0:
            kept.append(sim.detach().cpu().float().numpy().copy())
        calls += 1
        return solve(sim)

    _assignment._pairs = keep
    kwargs = dict(in_features=64, hidden=[args.width] * 3, out_features=10)
    model, pa = create_model("mlp", seed=0, **kwargs)
    _, pb = create_model("mlp", seed=1, **kwargs)
    result = weight_matching(model.symmetry_spec(), pa, pb)
    _assignment._pairs = solve

    load = os.getloadavg()[0]
    times = {"scipy": 0.0, "lapx": 0.0}
    print(
        f"width {args.width}: {calls} assignments in {result.iterations} sweeps, {len(kept)} kept"
    )
    print(f"{'matrix':>6}{'scipy s':>10}{'lapx s':>10}  same total")
    for i, sim in enumerate(kept):
        took = {}
        for name in ("scipy", "lapx") if i % 2 else ("lapx", "scipy"):
            start = time.perf_counter()
            if name == "scipy":
                rows, cols = linear_sum_assignment(sim.astype(np.float64), maximize=True)
            else:
                rows, cols = lapjvr(np.negative(sim), return_cost=False)
            took[name] = (
                time.perf_counter() - start,
                float(sim.astype(np.float64)[rows, cols].sum()),
            )
        same = abs(took["scipy"][1] - took["lapx"][1]) <= 1e-9 * abs(took["scipy"][1])
        for name in times:
            times[name] += took[name][0]
        print(f"{i * args.every:>6}{took['scipy'][0]:>10.3f}{took['lapx'][0]:>10.3f}  {same}")
    print(
        f"total: scipy {times['scipy']:.2f} s, lapx {times['lapx']:.2f} s, "
        f"ratio lapx / scipy {times['lapx'] / times['scipy']:.2f} "
        f"(load average {load:.1f} before, {os.getloadavg()[0]:.1f} after)"
    )


if __name__ == "__main__":
    main()
