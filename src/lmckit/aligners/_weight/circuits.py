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

With grouped-query attention every query head has its circuits with the key/value head
of its group. A space whose units are key/value groups (each carrying its query heads)
compares groups ``g`` of A and ``g'`` of B by the best pairing of their query heads when
the spec lets query heads permute within a group (nested query spaces), else by query
heads in order; a space nested in one group compares that group's query heads. The
key/value factors (``Ka Kb^T``, ``Va Vb^T``) are computed once per pair of key/value
heads and shared by their groups' query heads.

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

from lmckit.groups._assignment import assignment
from lmckit.symmetry._transform import CircuitPart, HeadCircuits, Space

__all__ = [
    "Reading",
    "circuit_params",
    "head_circuits",
    "head_counts",
    "head_similarity",
    "head_similarity_matrix",
    "projection",
    "residual_circuit_similarity",
]


def circuit_params(circuits: HeadCircuits | None) -> tuple[str, ...]:
    """The parameters a head space's circuits read (projections, biases, output)."""
    if circuits is None:
        return ()
    parts = (circuits.query, circuits.key, circuits.value)
    biases = (circuits.query_bias, circuits.key_bias, circuits.value_bias)
    names = [p.param for p in parts] + [b.param for b in biases if b is not None]
    return tuple(dict.fromkeys([*names, circuits.output]))


def projection(
    params: Mapping[str, Tensor],
    weight: CircuitPart,
    bias: CircuitPart | None,
    heads: int,
) -> Tensor:
    """Bias-augmented per-head projection ``[W_h | b_h]``: ``(heads, head_dim, d + 1)``."""
    w = params[weight.param]
    if weight.transposed:
        w = w.T
    w = w[weight.index(w.shape[0], heads)].float()
    rows = w.shape[0]
    if bias is None:
        b = torch.zeros(rows, dtype=torch.float32, device=w.device)
    else:
        b_all = params[bias.param]
        b = b_all[bias.index(b_all.shape[0], heads)].float()
    aug = torch.cat([w, b[:, None]], dim=1)
    return aug.reshape(heads, rows // heads, -1)


def _output(params: Mapping[str, Tensor], circuits: HeadCircuits, heads: int) -> Tensor:
    """Output columns per head: ``(heads, d_out, head_dim)``."""
    o = params[circuits.output].float()
    if circuits.output_transposed:
        o = o.T
    return o.reshape(o.shape[0], heads, -1).permute(1, 0, 2)


def head_counts(space: Space) -> tuple[HeadCircuits, int, int]:
    """The space's circuits, its number of query heads and of key/value heads."""
    circuits = space.circuits
    if circuits is None:
        raise ValueError(f"space {space.name!r} is not a head space with circuits")
    heads = circuits.heads or space.group.units(space.n)
    if heads is None:
        raise ValueError(f"space {space.name!r}: circuits without a head count")
    kv_heads = circuits.kv_heads or heads
    if heads % kv_heads:
        raise ValueError(f"space {space.name!r}: {heads} query heads in {kv_heads} groups")
    return circuits, heads, kv_heads


def _projections(
    params: Mapping[str, Tensor], circuits: HeadCircuits, heads: int, kv_heads: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``Q`` ``(heads, head_dim, d + 1)``, ``K, V`` ``(kv_heads, head_dim, d + 1)`` (one
    per key/value head: query head ``i`` reads ``i // (heads // kv_heads)``) and ``O``
    ``(heads, d_out, head_dim)``."""
    q = projection(params, circuits.query, circuits.query_bias, heads)
    k = projection(params, circuits.key, circuits.key_bias, kv_heads)
    v = projection(params, circuits.value, circuits.value_bias, kv_heads)
    return q, k, v, _output(params, circuits, heads)


def head_circuits(params: Mapping[str, Tensor], space: Space) -> tuple[Tensor, Tensor]:
    """Dense circuits per query head: ``QK`` ``(heads, d + 1, d + 1)`` and ``OV``
    ``(heads, d_out, d + 1)``."""
    circuits, heads, kv_heads = head_counts(space)
    q, k, v, o = _projections(params, circuits, heads, kv_heads)
    group = _group_of(heads, kv_heads, slice(None), q.device)
    return q.transpose(1, 2) @ k[group], o @ v[group]


def _group_of(heads: int, kv_heads: int, rows: slice, device: torch.device) -> Tensor:
    """The key/value head each query head of ``rows`` reads."""
    return torch.arange(heads, device=device)[rows] // (heads // kv_heads)


def head_similarity(
    space: Space,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    *,
    heads: slice | None = None,
) -> Tensor:
    """``S[i, j] = <QK^a_i, QK^b_j>_F + <OV^a_i, OV^b_j>_F`` over query heads.

    ``ref`` and ``other`` hold the two models' parameters (``other`` with every other
    space's alignment already applied, so both circuits live in the same frame).
    ``heads`` restricts both sides to a range of query heads (default all).
    """
    circuits, count, kv_heads = head_counts(space)
    rows = heads or slice(None)
    qa, ka, va, oa = _projections(ref, circuits, count, kv_heads)
    qb, kb, vb, ob = _projections(other, circuits, count, kv_heads)
    qa, oa, qb, ob = qa[rows], oa[rows], qb[rows], ob[rows]
    # key/value Gram blocks once per pair of key/value heads, not per pair of query heads
    # (grouped-query attention shares them across each group's query heads)
    group = _group_of(count, kv_heads, rows, qa.device)
    used = torch.unique(group)
    local = torch.searchsorted(used, group)
    ka, va, kb, vb = ka[used], va[used], kb[used], vb[used]
    # (i, j, a, b) Gram blocks between head i of A and head j of B
    qq = torch.einsum("iae,jbe->ijab", qa, qb)
    kk = torch.einsum("iae,jbe->ijab", ka, kb)[local][:, local]
    vv = torch.einsum("iae,jbe->ijab", va, vb)[local][:, local]
    oo = torch.einsum("dia,djb->ijab", oa.permute(1, 0, 2), ob.permute(1, 0, 2))
    return (qq * kk).sum((2, 3)) + (oo * vv).sum((2, 3))


def _spread(space: Space, sim: Tensor) -> Tensor:
    return space.group.spread(sim).float()


def head_similarity_matrix(
    space: Space,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    *,
    within: bool = False,
) -> Tensor:
    """:func:`head_similarity` as the ``(n, n)`` similarity of the space's solver.

    A space of one unit per query head compares heads; a space nested in a unit of a
    head space compares that unit's query heads; a space whose units are key/value
    groups compares groups by their query heads, each query head of A with the one of
    B that ``within`` pairs it with (the best pairing, when query heads permute within
    a group), else with the one in the same place.
    """
    _, heads, kv_heads = head_counts(space)
    group = space.group
    if space.nest is not None and space.nest.unit is not None:
        per = group.units(space.n) or 1
        start = space.nest.unit * per
        return _spread(space, head_similarity(space, ref, other, heads=slice(start, start + per)))
    units = group.units(space.n)
    sim = head_similarity(space, ref, other)
    if units == heads:
        return _spread(space, sim)
    per = heads // kv_heads
    blocks = sim.reshape(kv_heads, per, kv_heads, per).permute(0, 2, 1, 3)
    if not within:
        return _spread(space, torch.diagonal(blocks, dim1=2, dim2=3).sum(-1))
    grouped = torch.empty(kv_heads, kv_heads, dtype=sim.dtype, device=sim.device)
    for g in range(kv_heads):
        for h in range(kv_heads):
            block = blocks[g, h]
            best = assignment(block)
            grouped[g, h] = block[torch.arange(per), best.to(block.device)].sum()
    return _spread(space, grouped)


#: which of a head space's query, key and value projections read a space
Reading = tuple[bool, bool, bool]


def residual_circuit_similarity(
    space: Space,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    current: Tensor,
    *,
    inputs: bool | Reading = True,
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
        inputs, outputs: whether the residual is the heads' input and/or output space;
            ``inputs`` per projection (query, key, value) where only some read it (the
            latents of multi-head latent attention).
    """
    reading: Reading = (inputs, inputs, inputs) if isinstance(inputs, bool) else inputs
    circuits, h, kv_heads = head_counts(space)
    qa, ka, va, oa = _projections(ref, circuits, h, kv_heads)
    qb, kb, vb, ob = _projections(other, circuits, h, kv_heads)
    t = current.to(device=qa.device, dtype=qa.dtype)
    m, n = t.shape
    group = _group_of(h, kv_heads, slice(None), qa.device)

    def turned(x: Tensor, reads: bool) -> Tensor:  # X^a Ti (Ti = diag(T, 1), augmented)
        return torch.cat([x[..., :m] @ t, x[..., m:]], dim=-1) if reads else x

    def per_group(x: Tensor) -> Tensor:  # summed over each group's query heads
        return x.new_zeros(kv_heads, *x.shape[1:]).index_add_(0, group, x)

    # Q^a Ti Q^b^T per query head, K^a Ti K^b^T and V^a Ti V^b^T per key/value head
    pairs = ((qa, qb), (ka, kb), (va, vb))
    gq, gk, gv = (
        turned(xa, r) @ xb.transpose(-1, -2) for (xa, xb), r in zip(pairs, reading, strict=True)
    )
    grad = t.new_zeros(m, n)
    if any(reading):
        # d/dTi of <QK^a, Ti QK^b Ti^T> = QK^a Ti QK^b^T + QK^a^T Ti QK^b and of
        # <OV^a, To OV^b Ti^T> = OV^a^T To OV^b, in low rank: sum over heads and parts of
        # X^a^T M X^b with M = (K Ti K^T, Q Ti Q^T, O^T To O) for X = (Q, K, V); a
        # key/value head shared by a group takes its query heads' M summed (one product
        # per key/value head, not per query head)
        # (only the projections that read the space: their inputs share its width)
        o_turned = oa.transpose(1, 2) @ t if outputs else oa.transpose(1, 2)
        terms = (
            (gk[group].transpose(-1, -2) @ qa, qb),
            (per_group(gq).transpose(-1, -2) @ ka, kb),
            (per_group(o_turned @ ob).transpose(-1, -2) @ va, vb),
        )
        # (values may be narrower than queries and keys: each part's product alone)
        for (left, right), r in zip(terms, reading, strict=True):
            if r:
                g_in = left.reshape(-1, left.shape[-1]).T @ right.reshape(-1, right.shape[-1])
                grad += g_in[:m, :n]
    if outputs:
        # d/dTo of <OV^a, To OV^b Ti^T> = sum_h O^a (V^a Ti V^b^T) O^b^T
        z = oa @ gv[group]  # (h, d_out, value head dim)
        dv = z.shape[-1]
        grad += z.transpose(0, 1).reshape(m, h * dv) @ ob.transpose(0, 1).reshape(n, h * dv).T
    return grad
