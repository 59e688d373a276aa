"""Benchmark: weight matching of two 6-layer, 4-head, 256-wide (MLP 1024) GPT-2s.

The configuration of the paper's Tiny Shakespeare models (GPT-2 BPE vocabulary of
50,257 tokens, context 256), with independently initialised weights, rewritten to
RMSNorm form; orthogonal residual map, heads matched by QK/OV circuits, FFN
permutations, iterated to convergence (at most ``--max-iter`` sweeps). With
``--circuits`` the heads are first rewritten as QK/OV circuits (the paper's form; the
residual map then acts on both sides of every ``(d, d)`` circuit).

Run: ``python benchmarks/transformer_weight_matching.py [--threads 2] [--mode orthogonal]
[--circuits]``.
Prints wall and CPU seconds, sweeps and convergence. Target: under 15 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import time

import torch

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.forms._rewrites import heads_to_circuits, layernorm_to_rmsnorm
from lmckit.models import create_model
from lmckit.symmetry._transform import Permutation

CONFIG = {"vocab_size": 50257, "n_layer": 6, "n_head": 4, "n_embd": 256, "n_inner": 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-iter", type=int, default=15)
    parser.add_argument("--mode", choices=("orthogonal", "permutation"), default="orthogonal")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--circuits", action="store_true", help="heads as QK/OV circuits")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pairs = []
    for seed in (0, 1):
        module, params = create_model("gpt2", seed=seed, context=256, **CONFIG)
        rewritten = layernorm_to_rmsnorm(module, params)
        pairs.append(heads_to_circuits(*rewritten) if args.circuits else rewritten)
    module = pairs[0][0]
    spec = module.symmetry_spec()
    if args.mode == "permutation":
        spec = spec.with_groups(residual=Permutation())
    config = WeightMatchingConfig(max_iter=args.max_iter)
    for _ in range(args.repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = weight_matching(spec, pairs[0][1], pairs[1][1], config)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(
            f"mode={args.mode} circuits={args.circuits} threads={args.threads} "
            f"wall={wall:.2f}s cpu={cpu:.2f}s "
            f"sweeps={result.iterations} converged={result.converged}"
        )


if __name__ == "__main__":
    main()
