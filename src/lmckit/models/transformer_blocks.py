"""Pieces shared by the transformer zoo models (GPT-2, ViT): norms, attention, specs.

Residual-stream norms (``norm=``):

* ``"layer"``: ``nn.LayerNorm(d)``; the residual stream keeps only its permutation
  symmetry (the norm's scale and bias act unit by unit).
* ``"rms"``: ``nn.RMSNorm(d)`` *without* affine parameters,
  ``x / sqrt(mean(x^2) + eps)``; it commutes with every orthogonal map, so the
  residual stream has an orthogonal symmetry. :func:`lmckit.rewrites.layernorm_to_rmsnorm`
  turns a ``"layer"`` model into an equivalent ``"rms"`` one.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.symmetry import (
    CircuitPart,
    Group,
    HeadCircuits,
    HeadPermutation,
    Orthogonal,
    Permutation,
    Probe,
    Space,
    Use,
)

__all__ = [
    "TRANSFORMER_NORMS",
    "check_transformer_norm",
    "head_space",
    "make_residual_norm",
    "multi_head_attention",
    "residual_group",
]

TRANSFORMER_NORMS: tuple[str, ...] = ("layer", "rms")


def check_transformer_norm(norm: str) -> None:
    """Raise ``ValueError`` unless ``norm`` is one of :data:`TRANSFORMER_NORMS`."""
    if norm not in TRANSFORMER_NORMS:
        raise ValueError(
            f"unknown norm {norm!r} for a transformer; choose {', '.join(TRANSFORMER_NORMS)}"
        )


def make_residual_norm(norm: str, width: int, eps: float) -> nn.Module:
    """The norm applied to the residual stream before each reader (see module doc)."""
    check_transformer_norm(norm)
    if norm == "layer":
        return nn.LayerNorm(width, eps=eps)
    return nn.RMSNorm(width, eps=eps, elementwise_affine=False)


def residual_group(norm: str) -> Group:
    """Largest symmetry group of the residual stream under ``norm``."""
    check_transformer_norm(norm)
    return Permutation() if norm == "layer" else Orthogonal()


def multi_head_attention(
    q: Tensor, k: Tensor, v: Tensor, heads: int, *, causal: bool, dropout: float = 0.0
) -> Tensor:
    """Scaled dot-product attention of ``heads`` heads.

    ``q, k, v``: ``(batch, time, heads * head_dim)``, head ``h`` in the contiguous
    slice ``[h * head_dim, (h + 1) * head_dim)``; scores scaled by ``1 / sqrt(head_dim)``.
    Returns the heads' outputs concatenated the same way, ``(batch, time, heads * head_dim)``.
    """
    b, t, n = q.shape
    if n % heads:
        raise ValueError(f"width {n} does not split into {heads} heads")

    def split(x: Tensor) -> Tensor:
        return x.reshape(b, t, heads, n // heads).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        split(q), split(k), split(v), dropout_p=dropout, is_causal=causal
    )
    return out.transpose(1, 2).reshape(b, t, n)


def head_space(
    name: str,
    heads: int,
    head_dim: int,
    *,
    qkv: list[tuple[str, int, int]],
    output: str,
    biases: bool,
    probe: str,
) -> Space:
    """Attention head space: Q, K, V rows (writers) and the output's columns (reader).

    Args:
        name: space name.
        heads, head_dim: layout; the space has ``heads * head_dim`` units.
        qkv: ``(module, block, blocks)`` of the query, key and value projections, e.g.
            ``[("attn.c_attn", 0, 3), ("attn.c_attn", 1, 3), ("attn.c_attn", 2, 3)]``
            for a fused QKV layer.
        output: the module whose weight reads the heads (axis 1).
        biases: whether the projections have biases.
        probe: module whose output is the concatenated heads.
    """
    uses: list[Use] = []
    for module in dict.fromkeys(m for m, _, _ in qkv):
        blocks = next(bl for m, _, bl in qkv if m == module)
        uses.append(Use(f"{module}.weight", 0, "write", outer=blocks))
        if biases:
            uses.append(Use(f"{module}.bias", 0, "write", outer=blocks))
    uses.append(Use(f"{output}.weight", 1, "read"))
    parts = [CircuitPart(f"{m}.weight", b, bl) for m, b, bl in qkv]
    bias_parts = [CircuitPart(f"{m}.bias", b, bl) if biases else None for m, b, bl in qkv]
    circuits = HeadCircuits(
        parts[0],
        parts[1],
        parts[2],
        f"{output}.weight",
        bias_parts[0],
        bias_parts[1],
        bias_parts[2],
    )
    return Space(
        name,
        heads * head_dim,
        HeadPermutation(heads, head_dim),
        tuple(uses),
        (Probe(probe, axis=-1),),
        circuits=circuits,
    )
