"""Benchmark: symmetry inference and its check on GPT-2 (124M) and Llama (1.1B) shapes.

``--family gpt2``: a ``transformers`` ``GPT2LMHeadModel`` with GPT-2 small's
configuration (12 layers, 12 heads, width 768, vocabulary 50,257). ``--family llama``:
a ``LlamaForCausalLM`` of TinyLlama's shape (22 layers, width 2048, 32 query heads on
4 key/value heads, MLP 5632, vocabulary 32,000; 1.1B parameters). Random weights;
then ``lmckit.inference.analyze_symmetries`` (trace with ``torch.export``, abstract
interpretation, spaces, and the checks that decide rotary query/key bases, experts and
gated scales) and ``check_spec`` (random elements of every space, outputs compared in
float64 up to 134M parameters, above that in float32 module by module) on a batch of
2 x 8 tokens.

Run: ``python benchmarks/spec_inference.py [--family gpt2|llama] [--threads 2] [--layers N]``.
Prints the time of each phase and the spaces found. Target: under 30 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import time

import torch

from lmckit.inference import analyze_symmetries, check_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--family", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--layers", type=int, default=None, help="default: the real model's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    torch.manual_seed(0)
    if args.family == "gpt2":
        config = transformers.GPT2Config(n_layer=args.layers or 12, use_cache=False)
        module = transformers.GPT2LMHeadModel(config).eval()
    else:
        config = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=2048, intermediate_size=5632,
            num_hidden_layers=args.layers or 22, num_attention_heads=32,
            num_key_value_heads=4, max_position_embeddings=2048, use_cache=False,
        )  # fmt: skip
        module = transformers.LlamaForCausalLM(config).eval()
    params = sum(p.numel() for p in module.parameters())
    x = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))

    # what a user runs: inference (with the checks that decide proposals) and the check
    # of the whole spec (float64 for GPT-2, float32 for the 1.1B Llama: see
    # lmckit.inference._check); first in the process (cold), then once more (warm)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        analysis = analyze_symmetries(module, (x,))
        times.append(time.perf_counter() - start)
    errors = check_spec(module, analysis.spec, (x,))

    groups: dict[str, int] = {}
    for space in analysis.spec:
        groups[type(space.group).__name__] = groups.get(type(space.group).__name__, 0) + 1
    layers = config.num_hidden_layers
    print(f"{args.family} {layers} layers, {params / 1e6:.1f}M parameters, {args.threads} threads")
    print(f"spaces: {len(analysis.spec)} {groups}; left out: {len(analysis.left_out)}")
    print(f"inference and check of the whole spec: {times[0]:.2f} s cold, "
          f"{times[1]:.2f} s warm")  # fmt: skip
    print(f"check error (all spaces at once): {errors['all']:.1e}")


if __name__ == "__main__":
    main()
