"""A trained Llama pair after weight matching, its heads interpolated as circuits.

GPT-2's heads can be interpolated as their QK and OV circuits (``lmckit align
--circuits``), which no basis inside a head changes. Rotary heads have circuits too, one
pair per rotary plane ``p`` of frequency ``w_p``: the score between positions ``m`` and
``n`` is ``sum_p cos(w_p (n - m)) x_m^T Q_p^T K_p x_n + sin(w_p (n - m)) x_m^T Q_p^T J K_p
x_n`` (``Q_p``, ``K_p``: the plane's two rows of a query and a key head; ``J``: the quarter
turn), and ``Q_p^T K_p``, ``Q_p^T J K_p`` are unchanged by a rotation of the plane. The
linear path between two such circuits, ``(1 - t) C_a + t C_b``, is what a Llama computes
whose heads are twice as wide, ``[sqrt(1 - t) Q_a; sqrt(t) Q_b]`` and likewise for keys,
values and output columns, with each plane's frequency repeated for its copy. Gated MLP
units have the analogous circuit ``d_i u_i^T`` (down column times up row, unchanged by the
up branch's scale and sign): with the gate interpolated as usual, its path is an MLP of
twice the width whose two copies share the gate.

Reads the two models ``lmckit reproduce llama-shakespeare`` trained (``--run``), aligns
them by orthogonal weight matching in their folded form (as the experiment does) and
prints the loss barrier (11 points, the test split) of: the weights interpolated, the
heads' circuits interpolated, and the heads' and units' circuits interpolated. Then the
same after matching MLP units up to sign (a unit's up row and down column negated
together keep the function: the up branch's scale may be negative too), three rounds of
sign-aware unit assignment followed by weight matching.

Run: ``python benchmarks/llama_circuits.py --run runs/llama-shakespeare/full-<hash>``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from trained_llama import TEXT, load_pair

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.data import batches
from lmckit.groups import Permutation
from lmckit.groups._base import Subproblem
from lmckit.measure._evaluate import PathResult
from lmckit.symmetry._transform import apply

POINTS = [i / 10 for i in range(11)]
Params = dict[str, Tensor]


def widened(config: Any, heads: bool, units: bool) -> Any:
    """A Llama with twice the head width (each plane's frequency repeated) and/or twice
    the MLP width."""
    import transformers

    head_dim = config.hidden_size // config.num_attention_heads
    changes = {"head_dim": 2 * head_dim} if heads else {}
    if units:
        changes["intermediate_size"] = 2 * config.intermediate_size
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**{**config.to_dict(), **changes})
    ).eval()
    if heads:
        base = config.rope_parameters["rope_theta"]
        freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
        model.model.rotary_emb.inv_freq = torch.cat([freq, freq])
        model.model.rotary_emb.original_inv_freq = torch.cat([freq, freq])
    return model


def circuit_point(config: Any, a: Params, b: Params, t: float, heads: bool, units: bool) -> Params:
    """Parameters of the widened model at ``t``: circuits ``(1 - t) C_a + t C_b``."""
    out = {k: (1 - t) * a[k] + t * b[k] for k in a}
    sa, sb = math.sqrt(1 - t), math.sqrt(t)
    head_dim = config.hidden_size // config.num_attention_heads
    # Llama's rotate-half layout: plane j pairs dims j and j + half, so the wide head is
    # [a's first halves, b's first halves, a's second halves, b's second halves]
    half = head_dim // 2
    for layer in range(config.num_hidden_layers):
        pre = f"model.layers.{layer}."
        if heads:
            q, k, v, o = (f"{pre}self_attn.{x}_proj.weight" for x in "qkvo")
            for name, gain in ((q, math.sqrt(2)), (k, 1.0)):  # sqrt 2: the score's 1/sqrt(width)
                xa, xb = a[name].split(head_dim), b[name].split(head_dim)
                out[name] = gain * torch.cat([
                    torch.cat([sa * ha[:half], sb * hb[:half], sa * ha[half:], sb * hb[half:]])
                    for ha, hb in zip(xa, xb, strict=True)
                ])  # fmt: skip
            out[v] = torch.cat([
                torch.cat([sa * ha, sb * hb])
                for ha, hb in zip(a[v].split(head_dim), b[v].split(head_dim), strict=True)
            ])  # fmt: skip
            out[o] = torch.cat([
                torch.cat([sa * ha, sb * hb], 1)
                for ha, hb in zip(a[o].split(head_dim, 1), b[o].split(head_dim, 1), strict=True)
            ], 1)  # fmt: skip
        if units:
            g, u, d = (f"{pre}mlp.{x}_proj.weight" for x in ("gate", "up", "down"))
            out[g] = torch.cat([out[g], out[g]])
            out[u] = torch.cat([sa * a[u], sb * b[u]])
            out[d] = torch.cat([sa * a[d], sb * b[d]], 1)
    return out


def barrier(loss: Callable[[Params], float], point: Callable[[float], Params]) -> float:
    losses = [loss(point(t)) for t in POINTS]
    return PathResult(t=POINTS, loss=losses, acc=[0.0] * len(POINTS)).barrier_loss


def signed_units(config: Any, a: Params, b: Params) -> Params:
    """``b`` with each layer's MLP units reassigned to ``a``'s allowing a sign per unit
    (up row and down column negated together): similarity ``gate + |up + down|``."""
    out = dict(b)
    for layer in range(config.num_hidden_layers):
        g, u, d = (f"model.layers.{layer}.mlp.{x}_proj.weight" for x in ("gate", "up", "down"))
        both = a[u] @ out[u].T + a[d].T @ out[d]
        perm = Permutation().solve_subproblem(Subproblem(a[g] @ out[g].T + both.abs()))
        sign = torch.sign(both[torch.arange(len(perm)), perm])
        out[g], out[u] = out[g][perm], out[u][perm] * sign[:, None]
        out[d] = out[d][:, perm] * sign[None, :]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="llama-shakespeare run folder")
    parser.add_argument("--text", type=Path, default=TEXT / "input.txt")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.run, args.text)
    config, data, module, form = pair.config, pair.data, pair.module, pair.form
    pa = {k: form.a[k].float() for k in form.a}
    result = weight_matching(form.spec, form.a, form.b, WeightMatchingConfig())
    pb = {k: v.float() for k, v in apply(form.spec, form.b, result.transform).items()}
    hf = module.config
    models = {(h, u): widened(hf, h, u) for h, u in ((False, False), (True, False), (True, True))}

    def loss_of(model: Any) -> Callable[[Params], float]:
        @torch.no_grad()
        def loss(params: Params) -> float:
            model.load_state_dict(params, strict=True)
            total, count = 0.0, 0
            for x, y in batches(data.x_test, data.y_test, config.eval_batch):
                logits = model(x).logits
                total += float(torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), y.flatten(), reduction="sum"))  # fmt: skip
                count += y.numel()
            return total / count

        return loss

    def report(title: str, b_params: Params, objective: float) -> None:
        cells = []
        for (heads, units), model in models.items():

            def point(t: float, heads: bool = heads, units: bool = units) -> Params:
                return circuit_point(hf, pa, b_params, t, heads, units)

            cells.append(f"{barrier(loss_of(model), point):.4f}")
        weights, head, both = cells
        print(f"{title}: objective {objective:.3f}; barrier with weights {weights}, "
              f"head circuits {head}, head and unit circuits {both}", flush=True)  # fmt: skip

    report("orthogonal weight matching", pb, result.history[-1])
    signed = pb
    for _ in range(3):
        signed = signed_units(hf, pa, signed)
        again = weight_matching(form.spec, pa, signed, WeightMatchingConfig(start="identity"))
        signed = {k: v.float() for k, v in apply(form.spec, signed, again.transform).items()}
    report("units matched up to sign, 3 rounds", signed, again.history[-1])


if __name__ == "__main__":
    main()
