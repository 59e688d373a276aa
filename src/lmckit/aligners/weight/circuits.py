"""Attention heads as QK and OV circuits, and the head similarity used to match them.

For head ``h`` with bias-augmented projections ``Q_h = [W_q,h | b_q,h]``,
``K_h``, ``V_h`` (each ``(head_dim, d + 1)``, acting on ``[x; 1]``) and output columns
``O_h`` (``(d_out, head_dim)``), the circuits are

* ``QK_h = Q_h^T K_h`` (``(d + 1, d + 1)``): the attention score is ``[x;1]^T QK_h [y;1]``;
* ``OV_h = O_h V_h`` (``(d_out, d + 1)``): what the head writes per attended token.

Both are invariant under any invertible map inside a head, so they compare heads
whatever basis each model chose. Heads ``i`` of A and ``j`` of B are matched by
maximising ``<QK^a_i, QK^b_j>_F + <OV^a_i, OV^b_j>_F`` (equivalently minimising the
squared circuit distances: each head's own norm does not depend on the assignment).
All pairs cost ``O(heads^2 head_dim^2 d)`` without forming a circuit, using
``<Qa^T Ka, Qb^T Kb>_F = sum((Qa Qb^T) * (Ka Kb^T))`` and
``<Oa Va, Ob Vb>_F = sum((Oa^T Ob) * (Va Vb^T))``.

The same circuits tell the *residual stream* how to move. The raw ``W_q``, ``W_k``,
``W_v`` and ``W_o`` of two independently trained models sit in unrelated within-head
bases, so comparing them row by row (as for an MLP) is noise even after the heads are
matched; their circuits are comparable. With the residual map ``T`` acting on both
sides (``T~ = diag(T, 1)`` on the bias-augmented inputs), the matched heads contribute
``sum_h <QK^a_h, T~ QK^b_h T~^T> + <OV^a_h, T OV^b_h T~^T>``, quadratic in ``T``;
:func:`residual_circuit_similarity` is its gradient at the current ``T``, the linear
model that coordinate descent solves in place of the raw weights' term.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lmckit.symmetry import CircuitPart, HeadCircuits, HeadPermutation, Space

__all__ = [
    "head_circuits",
    "head_similarity",
    "head_similarity_matrix",
    "projection",
    "residual_circuit_similarity",
]


def projection(
    params: Mapping[str, Tensor],
    weight: CircuitPart,
    bias: CircuitPart | None,
    heads: int,
) -> Tensor:
    """Bias-augmented per-head projection ``[W_h | b_h]``: ``(heads, head_dim, d + 1)``."""
    w = params[weight.param]
    rows = w.shape[0] // weight.blocks
    w = w[weight.block * rows : (weight.block + 1) * rows].float()
    b = (
        torch.zeros(rows, dtype=torch.float32, device=w.device)
        if bias is None
        else params[bias.param][bias.block * rows : (bias.block + 1) * rows].float()
    )
    aug = torch.cat([w, b[:, None]], dim=1)
    return aug.reshape(heads, rows // heads, -1)


def _output(params: Mapping[str, Tensor], circuits: HeadCircuits, heads: int) -> Tensor:
    """Output columns per head: ``(heads, d_out, head_dim)``."""
    o = params[circuits.output].float()
    return o.reshape(o.shape[0], heads, -1).permute(1, 0, 2)


def head_circuits(params: Mapping[str, Tensor], space: Space) -> tuple[Tensor, Tensor]:
    """Dense circuits: ``QK`` ``(heads, d + 1, d + 1)`` and ``OV`` ``(heads, d_out, d + 1)``."""
    circuits, group = _check(space)
    q = projection(params, circuits.query, circuits.query_bias, group.heads)
    k = projection(params, circuits.key, circuits.key_bias, group.heads)
    v = projection(params, circuits.value, circuits.value_bias, group.heads)
    o = _output(params, circuits, group.heads)
    return q.transpose(1, 2) @ k, o @ v


def _check(space: Space) -> tuple[HeadCircuits, HeadPermutation]:
    if space.circuits is None or not isinstance(space.group, HeadPermutation):
        raise ValueError(f"space {space.name!r} is not a head space with circuits")
    return space.circuits, space.group


def head_similarity(space: Space, ref: Mapping[str, Tensor], other: Mapping[str, Tensor]) -> Tensor:
    """``S[i, j] = <QK^a_i, QK^b_j>_F + <OV^a_i, OV^b_j>_F``: ``(heads, heads)``.

    ``ref`` and ``other`` hold the two models' parameters (``other`` with every other
    space's alignment already applied, so both circuits live in the same frame).
    """
    circuits, group = _check(space)
    h = group.heads
    qa, qb = (projection(p, circuits.query, circuits.query_bias, h) for p in (ref, other))
    ka, kb = (projection(p, circuits.key, circuits.key_bias, h) for p in (ref, other))
    va, vb = (projection(p, circuits.value, circuits.value_bias, h) for p in (ref, other))
    oa, ob = _output(ref, circuits, h), _output(other, circuits, h)
    # (i, j, a, b) Gram blocks between head i of A and head j of B
    qq = torch.einsum("iae,jbe->ijab", qa, qb)
    kk = torch.einsum("iae,jbe->ijab", ka, kb)
    vv = torch.einsum("iae,jbe->ijab", va, vb)
    oo = torch.einsum("dia,djb->ijab", oa.permute(1, 0, 2), ob.permute(1, 0, 2))
    return (qq * kk).sum((2, 3)) + (oo * vv).sum((2, 3))


def head_similarity_matrix(
    space: Space, ref: Mapping[str, Tensor], other: Mapping[str, Tensor]
) -> Tensor:
    """:func:`head_similarity` as a unit-level ``(n, n)`` similarity for the solvers.

    ``kron(S / head_dim, I_head_dim)``: the head-permutation solver sums each block's
    diagonal, recovering ``S``, and ``<P, C>`` of a head permutation ``P`` is its
    total head similarity.
    """
    _, group = _check(space)
    sim = head_similarity(space, ref, other) / group.head_dim
    eye = torch.eye(group.head_dim, dtype=sim.dtype, device=sim.device)
    return torch.kron(sim, eye).float()


def residual_circuit_similarity(
    space: Space,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    current: Tensor,
    *,
    inputs: bool = True,
    outputs: bool = True,
) -> Tensor:
    """Similarity ``(m, n)`` for the residual map from matched heads' circuits.

    The gradient at ``T = current`` of
    ``f(T) = sum_h <QK^a_h, Ti QK^b_h Ti^T>_F + <OV^a_h, To OV^b_h Ti^T>_F``, where
    ``Ti = diag(T, 1)`` acts on the (bias-augmented) inputs the heads read and ``To = T``
    on the outputs they write; a side the residual does not touch (``inputs`` or
    ``outputs`` false) is held at the identity. Head ``h`` of ``ref`` is compared with
    head ``h`` of ``other``, so ``other`` must have the head permutation (and every map
    but the residual's) applied. Costs ``O(heads head_dim d^2)``: no circuit is formed.

    Args:
        space: the head space (with circuits).
        ref, other: the two models' parameters.
        current: the residual map's matrix ``(m, n)`` (reference x other units).
        inputs, outputs: whether the residual is the heads' input and/or output space.
    """
    circuits, group = _check(space)
    h = group.heads
    parts = [
        (circuits.query, circuits.query_bias),
        (circuits.key, circuits.key_bias),
        (circuits.value, circuits.value_bias),
    ]
    # Q, K, V of every head stacked: (3, h, k, e); O: (h, d_out, k)
    xa = torch.stack([projection(ref, w, b, h) for w, b in parts])
    xb = torch.stack([projection(other, w, b, h) for w, b in parts])
    oa, ob = _output(ref, circuits, h), _output(other, circuits, h)
    t = current.to(device=xa.device, dtype=xa.dtype)
    m, n = t.shape
    k = xa.shape[2]
    # X^a Ti for Q, K, V at once (one product; Ti = diag(T, 1) on the augmented inputs)
    turned = xa
    if inputs:
        turned = xa[..., :m] @ t
        turned = torch.cat([turned, xa[..., m:]], dim=-1)
    # per head: K^a Ti K^b^T, Q^a Ti Q^b^T, V^a Ti V^b^T  ->  (3, h, k, k)
    grams = turned @ xb.transpose(-1, -2)
    grad = t.new_zeros(m, n)
    if inputs:
        # d/dTi of <QK^a, Ti QK^b Ti^T> = QK^a Ti QK^b^T + QK^a^T Ti QK^b and of
        # <OV^a, To OV^b Ti^T> = OV^a^T To OV^b, in low rank: sum over heads and parts of
        # X^a^T M X^b with M = (K Ti K^T, Q Ti Q^T, O^T To O) for X = (Q, K, V)
        o_turned = oa.transpose(1, 2) @ t if outputs else oa.transpose(1, 2)
        mids = torch.stack([grams[1], grams[0], o_turned @ ob])
        left = mids.transpose(-1, -2) @ xa  # (3, h, k, e_a): M^T X^a
        g_in = left.reshape(3 * h * k, -1).T @ xb.reshape(3 * h * k, -1)
        grad += g_in[:m, :n]
    if outputs:
        # d/dTo of <OV^a, To OV^b Ti^T> = sum_h O^a (V^a Ti V^b^T) O^b^T
        z = oa @ grams[2]  # (h, d_out, k)
        grad += z.transpose(0, 1).reshape(m, h * k) @ ob.transpose(0, 1).reshape(n, h * k).T
    return grad
