"""Pieces shared by the transformer zoo models (GPT-2, ViT): norms, attention, specs.

Residual-stream norms (``norm=``):

* ``"layer"``: ``nn.LayerNorm(d)``; the residual stream keeps only its permutation
  symmetry (the norm's scale and bias act unit by unit).
* ``"rms"``: ``nn.RMSNorm(d)`` *without* affine parameters,
  ``x / sqrt(mean(x^2) + eps)``; it commutes with every orthogonal map, so the
  residual stream has an orthogonal symmetry. :func:`lmckit.forms.layernorm_to_rmsnorm`
  turns a ``"layer"`` model into an equivalent ``"rms"`` one.

Attention (``attention=``):

* ``"heads"``: query, key, value and output projections, ``heads`` heads of
  ``width / heads`` units.
* ``"circuits"``: every head stored as its QK and OV circuit (:class:`CircuitAttention`),
  the form in which heads have no inner bases left to align;
  :func:`lmckit.forms.heads_to_circuits` turns a ``"heads"`` model into it exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CircuitAttention",
    "check_attention_form",
    "check_transformer_norm",
    "make_residual_norm",
    "multi_head_attention",
]

_TRANSFORMER_NORMS: tuple[str, ...] = ("layer", "rms")
_ATTENTION_FORMS: tuple[str, ...] = ("heads", "circuits")


def check_transformer_norm(norm: str) -> None:
    """Raise ``ValueError`` unless ``norm`` is ``"layer"`` or ``"rms"``."""
    if norm not in _TRANSFORMER_NORMS:
        raise ValueError(
            f"unknown norm {norm!r} for a transformer; choose {', '.join(_TRANSFORMER_NORMS)}"
        )


def check_attention_form(attention: str) -> None:
    """Raise ``ValueError`` unless ``attention`` is ``"heads"`` or ``"circuits"``."""
    if attention not in _ATTENTION_FORMS:
        raise ValueError(
            f"unknown attention form {attention!r}; choose {', '.join(_ATTENTION_FORMS)}"
        )


def make_residual_norm(norm: str, width: int, eps: float) -> nn.Module:
    """The norm applied to the residual stream before each reader (see module doc)."""
    check_transformer_norm(norm)
    if norm == "layer":
        return nn.LayerNorm(width, eps=eps)
    return nn.RMSNorm(width, eps=eps, elementwise_affine=False)


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


class CircuitAttention(nn.Module):
    """Multi-head attention stored as each head's QK and OV circuit.

    For input rows ``x_j`` (``width``-dimensional, the normed residual stream), head
    ``h`` scores ``s_ij = (qk_weight[h] x_i + qk_bias[h]) . x_j`` and writes
    ``ov_weight[h] sum_j softmax_j(s_ij) x_j``; the heads' outputs are summed and
    ``ov_bias`` added. Parameters: ``qk_weight`` and ``ov_weight`` ``(heads, width,
    width)``, ``qk_bias`` ``(heads, width)``, ``ov_bias`` ``(width,)``.

    A projected head with query, key, value rows ``W_q, W_k, W_v`` (biases ``b_q, b_k,
    b_v``), output columns ``W_o`` and ``head_dim`` units has the circuits
    ``qk_weight = W_k^T W_q / sqrt(head_dim)``, ``qk_bias = W_k^T b_q / sqrt(head_dim)``
    and ``ov_weight = W_o W_v``; ``W_o b_v`` joins ``ov_bias``. Score terms constant
    over the keys (from ``b_k``) cancel in the softmax. These are exact in evaluation;
    with attention dropout in training, value biases are no longer folded exactly.
    ``dropout`` drops attention weights and the output, as GPT-2 does. The attention
    weights are computed explicitly (``(batch, heads, time, time)``), for the
    ``pattern`` probe.

    Every residual-stream map ``T`` acts on both sides of a circuit, so its symmetry
    group is the residual's alone, plus permutations of the heads.
    """

    def __init__(self, width: int, heads: int, *, causal: bool, dropout: float = 0.0) -> None:
        super().__init__()
        self.qk_weight = nn.Parameter(torch.empty(heads, width, width))
        self.qk_bias = nn.Parameter(torch.zeros(heads, width))
        self.ov_weight = nn.Parameter(torch.empty(heads, width, width))
        self.ov_bias = nn.Parameter(torch.zeros(width))
        # the attention weights (batch, heads, queries, keys) as a module's output: they do
        # not depend on the residual frame, so activation matching compares heads by them
        self.pattern = nn.Softmax(dim=-1)
        self.causal, self.dropout = causal, dropout
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        # the circuits of freshly initialised N(0, 0.02) projections (GPT-2's init)
        nn.init.normal_(self.qk_weight, 0.0, 0.02**2)
        nn.init.normal_(self.ov_weight, 0.0, 0.02**2 * math.sqrt(width / heads))

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        q = torch.einsum("btd,hed->bhte", x, self.qk_weight) + self.qk_bias[None, :, None, :]
        scores = torch.einsum("bhte,bse->bhts", q, x)
        if self.causal:
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        weights = self.attn_dropout(self.pattern(scores))
        mixed = torch.einsum("bhts,bse->bhte", weights, x)
        out = torch.einsum("bhtd,hed->bte", mixed, self.ov_weight) + self.ov_bias
        return self.resid_dropout(out)
