"""Plant a random element of a family's symmetry group, written from its architecture.

A :class:`Layout` says where each kind of hidden unit lives in a Hugging Face state
dict: the residual stream(s), MLP units, experts, attention heads grouped by key/value
head, and each head's value and query/key features. It is written by hand per family from
the family's modelling code (:mod:`tests.hf.oracle.layouts`), never from lmckit's spec.
:func:`plant` draws one element of every symmetry the layout names and applies it:

- a permutation (or, in the folded form, a rotation) of each residual stream, on every
  parameter that reads or writes it;
- a permutation of each MLP's units, of each mixture's experts and of the units inside
  each expert;
- a permutation of the key/value groups (each carrying its query heads), of the query
  heads inside each group, an orthogonal map per key/value head on the value features
  (undone on the output projection's columns) and a map of the query/key features that
  keeps every score (a rotation per rotary plane; any orthogonal map on pass-through
  dims and where positions are not rotary).

Every map is orthogonal, so a writer's rows and a reader's columns take the same map
along the axis (``W' = Q W`` and ``W' = W Q^T`` both read "apply ``Q`` along the axis").
A rotated stream needs its norms' scales folded first: :func:`fold` does it from the
layout's :class:`Norm` entries (each norm and the layers reading it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

QKKind = Literal["half", "interleaved", "full", "plane_signs", "none"]
Use = tuple[str, int] | tuple[str, int, int]


@dataclass(frozen=True)
class Block:
    """Hidden units laid out along one axis of one parameter.

    ``index`` holds the positions along ``axis`` of ``param[within]``, shaped by the units:
    e.g. ``(groups, heads per group, head_dim)`` for query rows.
    """

    param: str
    axis: int
    index: Tensor
    within: tuple[int, ...] = ()


@dataclass(frozen=True)
class QK:
    """How a head's query/key features may move without changing a score.

    ``half``: rotary planes ``(i, i + rotary_dim / 2)``; ``interleaved``: planes
    ``(2i, 2i + 1)``; both rotate each plane and any orthogonal map on the pass-through
    dims ``rotary_dim:``. ``full``: any orthogonal map (absolute or no positions).
    ``plane_signs``: each rotary plane negated or not (a norm over the head's features
    with one scale for all heads commutes with nothing more). ``none``: not planted.
    """

    kind: QKKind
    rotary_dim: int = 0


@dataclass(frozen=True)
class Attention:
    """One attention module. Query and output blocks are indexed ``(kv, per_group, d)``,
    key and value blocks ``(kv, d)``. Modules with the same ``tie`` share their group
    and query-head permutations (heads tied through a position bias computed once);
    ``per_head`` blocks (indexed ``(kv, per_group)``) and the norm scales ``q_scales`` and
    ``k_scales`` (indexed as the query and key blocks) move with the heads only.
    ``heads_move=False``: the heads' order is fixed (ALiBi slopes), their bases are not."""

    q: tuple[Block, ...]
    k: tuple[Block, ...]
    v: tuple[Block, ...]
    o: tuple[Block, ...]
    qk: QK
    tie: str | None = None
    per_head: tuple[Block, ...] = ()
    q_scales: tuple[Block, ...] = ()
    k_scales: tuple[Block, ...] = ()
    heads_move: bool = True


@dataclass(frozen=True)
class Units:
    """Units that permute together (index ``(n,)`` in every block)."""

    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Experts:
    """A mixture: ``blocks`` index the experts ``(E,)`` (stacked weights, router rows);
    ``units[e]`` are the units inside expert ``e`` (after the experts are permuted)."""

    blocks: tuple[Block, ...]
    units: tuple[Units, ...]


@dataclass(frozen=True)
class Norm:
    """A norm on the stream whose output only layers read: its scale (``offset`` plus
    the ``scale`` parameter; Gemma's ``1 + w`` has offset 1) folds into their columns
    (``readers``: ``(parameter, axis)``), and its ``shift`` is divided by the scale."""

    scale: str
    readers: tuple[tuple[str, int], ...]
    shift: str | None = None
    offset: float = 0.0


@dataclass(frozen=True)
class Stream:
    """A residual stream: ``(pattern, axis)`` of every parameter that reads or writes it
    (patterns are full regular expressions over parameter names), or ``(pattern, axis,
    copies)`` where the axis holds ``copies`` copies of the stream side by side (features
    concatenated). ``scales`` are norm scales: permuted with the stream, left alone by a
    rotation (they are folded to ones first). ``centered``: LayerNorms read it, so
    rotations must fix the ones vector."""

    uses: tuple[Use, ...]
    scales: tuple[Use, ...] = ()
    centered: bool = False
    #: every norm reading the stream, when the stream admits rotations once they are folded
    norms: tuple[Norm, ...] = ()


@dataclass(frozen=True)
class Layout:
    streams: tuple[Stream, ...] = ()
    units: tuple[Units, ...] = ()
    experts: tuple[Experts, ...] = ()
    attention: tuple[Attention, ...] = ()

    @property
    def rotates(self) -> bool:
        """Whether every stream admits rotations once its norms are folded."""
        return bool(self.streams) and all(s.norms for s in self.streams)

    def maps(self, *, rotate: bool = False) -> list[str]:
        """The kinds of maps :func:`plant` draws for this layout (docs/families.md)."""
        found = []
        if self.streams:
            found.append("residual rotation" if rotate else "residual")
        if self.units or any(e.units for e in self.experts):
            found.append("units")
        if self.experts:
            found.append("experts")
        if any(a.heads_move for a in self.attention):
            found.append("heads")
        if any(_per_group(a) > 1 and a.heads_move for a in self.attention):
            found.append("query")
        if any(a.v for a in self.attention):
            found.append("value")
        kinds = {a.qk.kind for a in self.attention} - {"none"}
        found += [f"qk ({k})" for k in sorted(kinds)]
        return found


# --- random maps (float64) ---------------------------------------------------------


def orthogonal(n: int, gen: torch.Generator) -> Tensor:
    """A random ``n x n`` orthogonal matrix."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def centered_orthogonal(n: int, gen: torch.Generator) -> Tensor:
    """A random orthogonal matrix that fixes the ones vector (a rotation of the
    zero-mean subspace): what commutes with a LayerNorm's mean subtraction."""
    basis = orthogonal(n, gen)
    basis[:, 0] = 1 / math.sqrt(n)
    basis, _ = torch.linalg.qr(basis)  # first column +-ones/sqrt(n), the rest orthogonal
    inner = torch.eye(n, dtype=torch.float64)
    inner[1:, 1:] = orthogonal(n - 1, gen)
    return basis @ inner @ basis.T


def _rotation(angle: float) -> Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s], [s, c]], dtype=torch.float64)


def qk_map(qk: QK, head_dim: int, gen: torch.Generator) -> Tensor:
    """A random map of one head's query/key features that keeps every score."""
    if qk.kind == "none":
        return torch.eye(head_dim, dtype=torch.float64)
    if qk.kind == "full":
        return orthogonal(head_dim, gen)
    r = qk.rotary_dim or head_dim
    out = torch.zeros(head_dim, head_dim, dtype=torch.float64)
    for i in range(r // 2):
        a, b = (i, i + r // 2) if qk.kind in ("half", "plane_signs") else (2 * i, 2 * i + 1)
        if qk.kind == "plane_signs":
            turn = math.pi * float(torch.randint(2, (), generator=gen))
        else:
            turn = 2 * math.pi * float(torch.rand((), generator=gen))
        out[[[a], [b]], [a, b]] = _rotation(turn)
    if r < head_dim:  # the pass-through dims: any orthogonal map
        rest = head_dim - r
        if qk.kind == "plane_signs":
            signs = 1 - 2 * torch.randint(2, (rest,), generator=gen).double()
            out[r:, r:] = torch.diag(signs)
        else:
            out[r:, r:] = orthogonal(rest, gen)
    return out


# --- acting on blocks ----------------------------------------------------------------


def _gather(state: Mapping[str, Tensor], block: Block) -> Tensor:
    sub = state[block.param][block.within] if block.within else state[block.param]
    return sub.movedim(block.axis, 0)[block.index]


def _scatter(state: dict[str, Tensor], block: Block, values: Tensor) -> None:
    sub = state[block.param][block.within] if block.within else state[block.param]
    sub.movedim(block.axis, 0)[block.index] = values  # a view: writes into the state


def _permute(state: dict[str, Tensor], block: Block, perm: Tensor, depth: int = 0) -> None:
    """Permute the units at index dim ``depth`` (for each leading unit separately when
    ``perm`` has a leading dim too: ``perm[g]`` permutes the units of ``g``)."""
    values = _gather(state, block)
    if depth == 0:
        values = values[perm]
    else:
        values = torch.stack([values[g][perm[g]] for g in range(values.shape[0])])
    _scatter(state, block, values)


def _map(state: dict[str, Tensor], block: Block, maps: Tensor, lead: int) -> None:
    """Apply ``maps[g]`` to the feature dim (index dim ``lead``) of leading unit ``g``."""
    values = _gather(state, block)
    moved = values.movedim(lead, -1)  # (g, ..., rest..., d)
    g = maps.shape[0]
    flat = moved.reshape(g, -1, moved.shape[-1])
    mapped = torch.einsum("gij,gnj->gni", maps, flat).reshape(moved.shape)
    _scatter(state, block, mapped.movedim(-1, lead))


def _stream_blocks(state: Mapping[str, Tensor], stream: Stream, rotate: bool) -> list[Block]:
    uses = stream.uses if rotate else stream.uses + stream.scales  # folded scales are ones
    blocks: dict[tuple[str, int], Block] = {}
    for pattern, axis, *copies in uses:
        for name in (k for k in state if re.fullmatch(pattern, k)):
            n = state[name].shape[axis]
            key = (name, axis % state[name].dim())
            assert key not in blocks, f"{key} is in the stream twice"  # it would move twice
            blocks[key] = Block(name, axis, torch.arange(n).view(*copies or [1], -1))
    return list(blocks.values())


def _per_group(att: Attention) -> int:
    return int(att.q[0].index.shape[1])


# --- the plant -----------------------------------------------------------------------


@dataclass
class _Draws:
    gen: torch.Generator
    tied: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)


def _plant_stream(
    state: dict[str, Tensor], stream: Stream, rotate: bool, gen: torch.Generator
) -> None:
    blocks = _stream_blocks(state, stream, rotate)
    n = int(blocks[0].index.shape[1])
    if rotate:
        q = centered_orthogonal(n, gen) if stream.centered else orthogonal(n, gen)
        for block in blocks:
            _map(state, block, q.expand(len(block.index), n, n), lead=1)
    else:
        perm = torch.randperm(n, generator=gen)
        for block in blocks:
            _permute(state, block, perm.expand(len(block.index), n), depth=1)


def _plant_units(state: dict[str, Tensor], units: Units, gen: torch.Generator) -> None:
    perm = torch.randperm(int(units.blocks[0].index.shape[0]), generator=gen)
    for block in units.blocks:
        _permute(state, block, perm)


def _plant_attention(state: dict[str, Tensor], att: Attention, draws: _Draws) -> None:
    kv, per_group = int(att.q[0].index.shape[0]), _per_group(att)
    gen = draws.gen
    if att.heads_move:
        key = att.tie if att.tie is not None else f"#{id(att)}"
        if key not in draws.tied:
            groups = torch.randperm(kv, generator=gen)
            within = torch.stack([torch.randperm(per_group, generator=gen) for _ in range(kv)])
            draws.tied[key] = (groups, within)
        groups, within = draws.tied[key]
        queries = (*att.q, *att.o, *att.per_head, *att.q_scales)
        for block in (*queries, *att.k, *att.v, *att.k_scales):
            _permute(state, block, groups)
        for block in queries:
            _permute(state, block, within, depth=1)
    if att.v:
        d_v = int(att.v[0].index.shape[-1])
        values = torch.stack([orthogonal(d_v, gen) for _ in range(kv)])
        for block in att.v:
            _map(state, block, values, lead=1)
        for block in att.o:
            _map(state, block, values, lead=2)
    d_qk = int(att.k[0].index.shape[-1])
    qks = torch.stack([qk_map(att.qk, d_qk, gen) for _ in range(kv)])
    for block in att.k:
        _map(state, block, qks, lead=1)
    for block in att.q:
        _map(state, block, qks, lead=2)


def plant(
    state: Mapping[str, Tensor], layout: Layout, *, seed: int, rotate: bool = False
) -> dict[str, Tensor]:
    """A copy of ``state`` moved by a random element of every symmetry in ``layout``
    (float64 inside, the input's dtypes out); ``rotate``: the residual stream rotated
    (norm scales folded to ones beforehand) instead of permuted."""
    gen = torch.Generator().manual_seed(seed)
    out = {k: v.detach().double().clone() for k, v in state.items()}
    for stream in layout.streams:
        _plant_stream(out, stream, rotate, gen)
    for units in layout.units:
        _plant_units(out, units, gen)
    for mixture in layout.experts:
        perm = torch.randperm(int(mixture.blocks[0].index.shape[0]), generator=gen)
        for block in mixture.blocks:
            _permute(out, block, perm)
        for units in mixture.units:
            _plant_units(out, units, gen)
    draws = _Draws(gen)
    for att in layout.attention:
        _plant_attention(out, att, draws)
    return {k: out[k].to(state[k].dtype) for k in state}


def fold(state: Mapping[str, Tensor], layout: Layout) -> dict[str, Tensor]:
    """A copy of ``state`` with every stream norm's scale folded into the layers reading
    it: the same function, the norms' scales now one (the form a rotated stream needs)."""
    out = {k: v.detach().double().clone() for k, v in state.items()}
    for stream in layout.streams:
        for norm in stream.norms:
            g = norm.offset + out[norm.scale]
            for name, axis in norm.readers:
                shape = [1] * out[name].dim()
                shape[axis] = -1
                out[name] = out[name] * g.view(shape)
            out[norm.scale] = torch.full_like(g, 1 - norm.offset)
            if norm.shift is not None:
                out[norm.shift] = out[norm.shift] / g
    return {k: out[k].to(state[k].dtype) for k in state}
