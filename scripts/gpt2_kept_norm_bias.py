"""Study: does it matter where the LayerNorm biases live on the interpolation path?

lmckit's RMSNorm rewrite folds each LayerNorm's bias ``b`` into the readers' biases
(``c + R b``); the paper's code keeps ``b / g`` as an RMSNorm bias and interpolates it on
its own. Both are exact at the ends but give different paths. This script aligns a
pair trained by ``scripts/gpt2_wm_variants.py --config proxy|mid`` in circuit form
(orthogonal weight matching with token-frequency weights, as ``gpt2-shakespeare``) and
measures the test barrier along both paths (11 points). The kept-bias path is evaluated
by folding the interpolated biases into the interpolated circuit model at each point
(key-side terms cancel in the softmax, so this is exact).

    python scripts/gpt2_kept_norm_bias.py /tmp/mid --config mid --data-root ../shared/data
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from gpt2_wm_variants import MID, PROXY, setup
from torch import Tensor
from torch.func import functional_call
from torch.nn.functional import cross_entropy

from lmckit.aligners import weight_matching
from lmckit.data import batches
from lmckit.data._token_stats import seen_token_masks, token_row_weights
from lmckit.formats import _checkpoint as checkpoint
from lmckit.forms._recipe import aligned_form
from lmckit.symmetry._transform import apply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the OUT folder of gpt2_wm_variants.py")
    parser.add_argument("--config", choices=["proxy", "mid"], default="mid")
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    args = parser.parse_args()
    config = {"proxy": PROXY, "mid": MID}[args.config]
    root, data = setup(args.out, args.config, config, args.data_root)
    ln_a, ln_b = (
        checkpoint.load(root / "models" / f"gpt2-{config.n_embd}-seed{s}") for s in (0, 1)
    )
    layers = ln_a.module.n_layer
    norms = [f"transformer.h.{i}.ln_{k}" for k in (1, 2) for i in range(layers)]
    norms.append("transformer.ln_f")

    def forms(params):
        """Circuit form with biases folded, circuit form without them, and ``b / g``."""
        full = aligned_form(ln_a.module, params, params, symmetry="orthogonal", circuits=True)
        circuits, folded = full.module, full.a
        zero = dict(params) | {f"{n}.bias": torch.zeros_like(params[f"{n}.bias"]) for n in norms}
        bare = aligned_form(ln_a.module, zero, zero, symmetry="orthogonal", circuits=True).a
        betas = {n: params[f"{n}.bias"] / params[f"{n}.weight"] for n in norms}
        return circuits, folded, bare, betas

    circuits, folded_a, bare_a, betas_a = forms(ln_a.params)
    _, folded_b, bare_b, betas_b = forms(ln_b.params)
    spec = circuits.symmetry_spec()
    transform = weight_matching(
        spec,
        folded_a,
        folded_b,
        row_masks=seen_token_masks(data),
        row_weights=token_row_weights(data),
    ).transform
    folded_b, bare_b = apply(spec, folded_b, transform), apply(spec, bare_b, transform)
    rotation = spec["residual"].group.matrix(transform["residual"]).float()
    betas_b = {n: rotation @ v for n, v in betas_b.items()}

    def fold(bare: dict[str, Tensor], betas: dict[str, Tensor]) -> dict[str, Tensor]:
        out = dict(bare)
        for i in range(layers):
            pre = f"transformer.h.{i}"
            b1, b2 = betas[f"{pre}.ln_1"], betas[f"{pre}.ln_2"]
            qk, ov = out[f"{pre}.attn.qk_weight"], out[f"{pre}.attn.ov_weight"]
            out[f"{pre}.attn.qk_bias"] = out[f"{pre}.attn.qk_bias"] + torch.einsum(
                "hed,d->he", qk, b1
            )
            out[f"{pre}.attn.ov_bias"] = out[f"{pre}.attn.ov_bias"] + torch.einsum(
                "hed,d->e", ov, b1
            )
            out[f"{pre}.mlp.c_fc.bias"] = (
                out[f"{pre}.mlp.c_fc.bias"] + out[f"{pre}.mlp.c_fc.weight"] @ b2
            )
        out["lm_head.bias"] = (
            out["lm_head.bias"] + out["lm_head.weight"] @ betas["transformer.ln_f"]
        )
        return out

    x, y = data.split("test")
    circuits.eval()

    def loss(params: dict[str, Tensor]) -> float:
        total, count = 0.0, 0
        with torch.no_grad():
            for xb, yb in batches(x, y, 16):
                logits = functional_call(circuits, params, (xb,))
                total += float(cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="sum"))
                count += yb.numel()
        return total / count

    ts = [i / 10 for i in range(11)]

    def mix(a: dict[str, Tensor], b: dict[str, Tensor], t: float) -> dict[str, Tensor]:
        return {k: (1 - t) * a[k] + t * b[k] for k in a}

    folded = [loss(mix(folded_a, folded_b, t)) for t in ts]
    kept = [loss(fold(mix(bare_a, bare_b, t), mix(betas_a, betas_b, t))) for t in ts]
    for name, curve in (
        ("biases folded into readers (lmckit)", folded),
        ("biases kept (paper's code)", kept),
    ):
        barrier = max(
            v - ((1 - t) * curve[0] + t * curve[-1]) for t, v in zip(ts, curve, strict=True)
        )
        print(
            f"{args.config}: {name}: barrier {barrier:.4f}, ends {curve[0]:.4f} / {curve[-1]:.4f}"
        )


if __name__ == "__main__":
    main()
