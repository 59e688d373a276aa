"""Benchmark: symmetry inference and its check on a GPT-2 of 124M-parameter shape.

A ``transformers`` ``GPT2LMHeadModel`` with GPT-2 small's configuration (12 layers,
12 heads, width 768, vocabulary 50,257, 1,024 positions) and random weights, built on
the meta device and materialised once; then ``lmckit.spec.analyze_symmetries`` (trace
with ``torch.export``, abstract interpretation, spaces) and ``check_spec`` (random
elements of every space, outputs compared in float64) on a batch of 2 x 8 tokens.

Run: ``python benchmarks/spec_inference.py [--threads 2] [--layers 12]``.
Prints the time of each phase and the spaces found. Target: under 30 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import time

import torch

from lmckit.spec import analyze_symmetries, check_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    config = transformers.GPT2Config(n_layer=args.layers, use_cache=False)
    torch.manual_seed(0)
    module = transformers.GPT2LMHeadModel(config).eval()
    params = sum(p.numel() for p in module.parameters())
    x = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))

    start = time.perf_counter()
    analysis = analyze_symmetries(module, (x,), check=False)
    inferred = time.perf_counter() - start
    start = time.perf_counter()
    errors = check_spec(module, analysis.spec, (x,))
    checked = time.perf_counter() - start

    groups: dict[str, int] = {}
    for space in analysis.spec:
        groups[type(space.group).__name__] = groups.get(type(space.group).__name__, 0) + 1
    print(f"GPT-2 {args.layers} layers, {params / 1e6:.1f}M parameters, {args.threads} threads")
    print(f"spaces: {len(analysis.spec)} {groups}; left out: {len(analysis.left_out)}")
    print(f"inference (trace + analysis): {inferred:.2f} s")
    print(f"check (float64, all spaces at once): {checked:.2f} s, error {errors['all']:.1e}")
    print(f"total: {inferred + checked:.2f} s")


if __name__ == "__main__":
    main()
