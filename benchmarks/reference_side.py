"""The reference side of ``reference_comparison.py``: run the paper's code on two GPT-2s.

Runs in the reference code's own environment (transformers 4.50.1, POT, einops; no
lmckit), as a subprocess of the comparison, with the reference checkout on ``sys.path``.
It builds the reference's ``GPTMerger`` for two Hugging Face GPT-2 folders (LayerNorm
scales absorbed, RMSNorm with kept biases, heads as circuits, then its data-free weight
matching: 15 iterations by default), optionally trains the merger's maps the way the
reference's ``train_merger.py`` configures its ``Trainer`` (AdamW, lr 3e-4, weight decay
0.01, cosine with 5 % warm-up, batch 32, interpolation weight drawn from U(0.4, 0.6);
here a plain loop over the training blocks it is given, from the merger's own maps: the
identity plus 1e-2 noise), and writes both models' aligned
weights in the reference's circuit layout: model 0 as rewritten, and model 1 as the
merger sees it at coefficient 0 (every map of the merger applied; without learning the maps
are set to the exact identity, so B is the weight-matching result). Nothing is evaluated
here: the comparison evaluates both sides with one evaluator.

Output (``--out DIR``): ``weights.safetensors`` (``a.<name>``, ``b.<name>``),
``meta.json`` (seconds per phase, widths), ``check.safetensors`` (the merger's logits at
coefficient 0.5 on a few blocks, to check the comparison's reading of the layout).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch


def _effective_b(merger) -> dict[str, torch.Tensor]:
    """Model 1's weights as the merger uses them (all its maps applied), circuit layout."""
    m = merger.model
    merger._project(coeff=0.0)
    out = {
        "transformer.wte.weight": m.transformer.wte.embedding_1.weight @ m.transformer.wte.P,
        "transformer.wpe.weight": m.transformer.wpe.embedding_1.weight @ m.transformer.wpe.P,
        "transformer.ln_f.bias": m.transformer.ln_f.P @ m.transformer.ln_f.bias_1,
        "lm_head.weight": (m.lm_head.P_in @ m.lm_head.conv1d_1_weight).t(),
    }
    for i, block in enumerate(m.transformer.h):
        pre = f"transformer.h.{i}"
        for k in ("ln_1", "ln_2"):
            norm = getattr(block, k)
            out[f"{pre}.{k}.bias"] = norm.P @ norm.bias_1
        attn = block.attn.c_attn
        w, b = attn._permute_heads(attn.conv1d_1_weight, attn.conv1d_1_bias, attn.P_out)
        out[f"{pre}.attn.c_attn.weight"], out[f"{pre}.attn.c_attn.bias"] = w, b.reshape(-1)
        proj = block.attn.c_proj
        w, b = proj._permute_heads(
            proj.conv1d_1_weight @ proj.P_out, proj.conv1d_1_bias @ proj.P_out, proj.P_in
        )
        out[f"{pre}.attn.c_proj.weight"], out[f"{pre}.attn.c_proj.bias"] = w, b.reshape(-1)
        for k in ("c_fc", "c_proj"):
            lin = getattr(block.mlp, k)
            out[f"{pre}.mlp.{k}.weight"] = lin.P_in @ lin.conv1d_1_weight @ lin.P_out
            out[f"{pre}.mlp.{k}.bias"] = lin.conv1d_1_bias @ lin.P_out
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


class _TorchWithRoundoff:
    """``torch`` as the reference's ``merger`` module sees it, with ``allclose`` scaled
    to the compared values: its checks that a rewrite kept the logits (fixed
    ``atol=1e-5``) fail on float32 round-off alone for logits of magnitude ~10 (1.1e-5
    seen on a CPU-trained pair). Everything else is ``torch`` itself."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def allclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
        scale = max(1.0, float(a.detach().abs().max()))
        return torch.allclose(a, b, rtol=rtol, atol=atol * scale, equal_nan=equal_nan)


def _state_a(model) -> dict[str, torch.Tensor]:
    """Model 0 after the merger's rewrites (circuit layout, RMSNorm biases kept)."""
    keep = ("weight", "bias")
    out = {}
    for name, value in model.state_dict().items():
        if name.endswith(keep) and not name.endswith(".attn.bias"):
            out[name] = value.detach().contiguous().clone()
    if "lm_head.weight" not in out:
        out["lm_head.weight"] = model.lm_head.weight.detach().clone()
    return out


def _identity_maps(merger) -> None:
    """Set the merger's maps to the identity (its default start adds 1e-2 noise)."""
    with torch.no_grad():
        for p in merger.proj.values():
            p.copy_(torch.eye(*p.shape))


def _train(merger, blocks: torch.Tensor, args: argparse.Namespace) -> dict[str, float]:
    """Train the merger's maps on ``blocks`` (the reference's Trainer settings)."""
    params = [p for p in merger.proj.values()]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    steps_per_epoch = math.ceil(len(blocks) / args.batch_size)
    total = max(1, int(args.epochs * steps_per_epoch))
    if args.max_steps:
        total = min(total, args.max_steps)
    warm = max(1, int(0.05 * total))

    def lr_at(step: int) -> float:
        if step < warm:
            return step / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    merger.set_sampler(sampler_type="narrow_uniform")
    gen = torch.Generator().manual_seed(args.seed)
    step, start, last = 0, time.perf_counter(), float("nan")
    merger.train()
    while step < total:
        order = torch.randperm(len(blocks), generator=gen)
        for i in range(0, len(blocks), args.batch_size):
            if step >= total or time.perf_counter() - start > args.max_seconds:
                break
            x = blocks[order[i : i + args.batch_size]]
            loss = merger(input_ids=x, labels=x).loss  # HF shifts the labels
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            last = float(loss.detach())
        if time.perf_counter() - start > args.max_seconds:
            break
    merger.eval()
    merger.set_sampler(sampler_type=None)
    return {"steps": step, "seconds": time.perf_counter() - start, "last_loss": last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="the checkout")
    parser.add_argument("--a", type=Path, required=True)
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("--freqs", type=Path, required=True, help="token counts (.pt)")
    parser.add_argument("--check", type=Path, required=True, help="check blocks (.pt)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--permutations-only", action="store_true")
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--learn", type=Path, default=None, help="train blocks (.pt)")
    parser.add_argument("--epochs", type=float, default=5.0)
    parser.add_argument("--max-steps", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=math.inf)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    sys.path.insert(0, str(args.reference.resolve()))
    import merger as ref_merger  # the reference's module
    import weight_matching as ref_wm
    from safetensors.torch import save_file
    from transformers import GPT2LMHeadModel

    timings: dict[str, float] = {}
    matcher = ref_wm.weight_matching

    def timed_matching(*a, **k):
        k["iterations"] = args.iterations
        begin = time.perf_counter()
        out = matcher(*a, **k)
        timings["weight_matching"] = time.perf_counter() - begin
        return out

    ref_merger.weight_matching = timed_matching  # time the matching alone
    ref_merger.torch = _TorchWithRoundoff()  # its output checks, with a round-off tolerance
    models = [
        GPT2LMHeadModel.from_pretrained(str(p), attn_implementation="eager").eval()
        for p in (args.a, args.b)
    ]
    freqs = torch.load(args.freqs, weights_only=True)
    begin = time.perf_counter()
    merger = ref_merger.GPTMerger(
        models[0], models[1], token_freqs=freqs, permutations_only=args.permutations_only
    )
    timings["merger_total"] = time.perf_counter() - begin
    meta: dict[str, object] = {"timings": timings, "learned": None}
    if args.learn is None:
        _identity_maps(merger)
    else:
        # learning starts from the merger's own near-identity maps: the SVD's gradient is
        # undefined at the identity (all singular values equal)
        blocks = torch.load(args.learn, weights_only=True)
        meta["learned"] = _train(merger, blocks, args)
    merger.eval()
    state = {f"a.{k}": v for k, v in _state_a(models[0]).items()}
    state |= {f"b.{k}": v for k, v in _effective_b(merger).items()}
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(args.out / "weights.safetensors"))
    check = torch.load(args.check, weights_only=True)
    merger.set_sampler(sampler_type=None, fixed_coeff=0.5)
    with torch.no_grad():
        logits = merger(input_ids=check).logits
    save_file({"logits": logits.contiguous()}, str(args.out / "check.safetensors"))
    config = models[0].config
    meta |= {"n_head": config.n_head, "n_embd": config.n_embd, "n_layer": config.n_layer}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
