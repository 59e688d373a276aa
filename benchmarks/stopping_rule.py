"""Weight matching's stopping rule on a trained pair: sweeps and barrier vs ``sweep_tol``.

Reads the two Llama models that ``lmckit reproduce llama-shakespeare`` trained (their
run folder, ``--run``), puts them in the orthogonal form (RMSNorm scales folded, the
residual stream orthogonal) and runs weight matching with ``sweep_tol`` 0 (sweep until no
space improves), 1e-6 ... 1e-3, and with 1, 2, 3 sweeps at most; for each, the sweeps,
the last objective and the loss barrier of the linear path on the first 512 test blocks.

Run: ``python benchmarks/stopping_rule.py --run runs/llama-shakespeare/full-<hash>``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from trained_llama import TEXT, load_pair

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.data import batches
from lmckit.measure._evaluate import evaluate_path
from lmckit.symmetry._transform import apply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="llama-shakespeare run folder")
    parser.add_argument("--text", type=Path, default=TEXT / "input.txt")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.run, args.text)
    module, form, data = pair.module, pair.form, pair.data
    x, y = data.x_test[:512], data.y_test[:512]

    def barrier(pb: dict) -> float:
        return evaluate_path(module, form.a, pb, lambda: batches(x, y, 64)).barrier_loss

    print(f"unaligned: barrier {barrier(form.b):.4f}")
    tols = (0, 1e-6, 1e-5, 1e-4, 1e-3)
    runs = [(f"sweep_tol={t:g}", WeightMatchingConfig(sweep_tol=t)) for t in tols]
    runs += [(f"max {k} sweeps", WeightMatchingConfig(max_iter=k, sweep_tol=0)) for k in (1, 2, 3)]
    for name, wm in runs:
        start = time.perf_counter()
        result = weight_matching(form.spec, form.a, form.b, wm)
        seconds = time.perf_counter() - start
        aligned = apply(form.spec, form.b, result.transform)
        print(f"{name:16s} {result.iterations:3d} sweeps  objective {result.history[-1]:.6f}  "
              f"barrier {barrier(aligned):.4f}  ({seconds:.1f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
