"""Where attention heads' projections live, for comparing heads by their circuits.

A head space of a :class:`~lmckit.symmetry.SymmetrySpec` may name the rows of its query,
key and value projections and its output columns (:class:`HeadCircuits`): weight
matching then compares heads by their QK and OV circuits, which no basis inside a head
changes (:mod:`lmckit.aligners._weight.circuits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["CircuitPart", "HeadCircuits"]


@dataclass(frozen=True)
class CircuitPart:
    """Rows of a parameter that hold one attention projection (Q, K or V) of every head.

    Axis 0 of ``param`` is read as ``blocks`` blocks of ``n`` rows and block ``block``
    is the projection, e.g. ``CircuitPart("attn.c_attn.weight", 1, 3)`` for the keys of
    a fused ``(3 n, d)`` QKV weight; or, with ``rows``, the projection is rows
    ``[start, start + rows)`` (blocks of unequal size: Phi-3's fused ``qkv_proj`` with
    fewer key/value heads than query heads); or, with ``per_head``, axis 0 is laid out
    head by head and each head's rows hold the ``blocks`` blocks (GPT-NeoX's
    ``query_key_value``: head ``h``'s query, key and value rows, then head ``h + 1``'s);
    with ``per_head`` and ``rows`` both, the projection is rows ``[start, start + rows)``
    of each head's (blocks of unequal size inside each head: the position-free query
    rows of multi-head latent attention, before each head's rotary rows).
    ``transposed``: the weight is stored ``(in, out)`` (Hugging Face's ``Conv1D``), so
    its rows are the columns of ``param``.
    """

    param: str
    block: int = 0
    blocks: int = 1
    transposed: bool = False
    start: int = 0
    rows: int | None = None
    per_head: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.block < self.blocks:
            raise ValueError(f"block {self.block} out of range for {self.blocks} blocks")
        if self.start < 0 or (self.rows is not None and self.rows < 1):
            raise ValueError(f"rows [{self.start}, +{self.rows}) is not a block of rows")
        if self.per_head and self.rows is not None and self.blocks != 1:
            raise ValueError("rows by offsets and blocks inside each head exclude each other")

    def index(self, total: int, heads: int) -> slice | Tensor:
        """The rows of a parameter of ``total`` rows that hold the projection of
        ``heads`` heads, head by head: a slice, or an index tensor when the blocks lie
        inside each head. Reads ``x[index]`` and writes ``x[index] = y`` alike."""
        if self.rows is not None and not self.per_head:
            return slice(self.start, self.start + self.rows)
        per_block = total // self.blocks
        if not self.per_head:
            return slice(self.block * per_block, (self.block + 1) * per_block)
        per_head = total // heads
        if self.rows is not None:
            start, width = self.start, self.rows
        else:
            start, width = self.block * (per_head // self.blocks), per_head // self.blocks
        first = torch.arange(heads)[:, None] * per_head + start
        return (first + torch.arange(width)[None, :]).reshape(-1)


@dataclass(frozen=True)
class HeadCircuits:
    """Where a head space's QK and OV circuits live (bias-augmented).

    For head ``h`` with query rows ``Q_h = [W_q,h | b_q,h]`` (``(head_dim, d + 1)``)
    and keys ``K_h`` alike, the QK circuit is ``Q_h^T K_h``; with values ``V_h`` and
    the output columns ``O_h`` (``(d_out, head_dim)``) of ``output``, the OV circuit
    is ``O_h V_h``. Heads are matched on these, see :mod:`lmckit.aligners._weight.circuits`.
    ``output_transposed``: the output weight is stored ``(in, out)``.

    With grouped-query attention, ``heads`` query heads share ``kv_heads`` key/value
    heads (query head ``h`` reads key/value head ``h // (heads // kv_heads)``); ``None``
    means one key/value head per query head, and ``heads`` defaults to the space's
    head count. The circuits of a space nested in a head space
    (:class:`Nest`) are those of its parent's heads; it compares the heads of its unit.
    """

    query: CircuitPart
    key: CircuitPart
    value: CircuitPart
    output: str
    query_bias: CircuitPart | None = None
    key_bias: CircuitPart | None = None
    value_bias: CircuitPart | None = None
    heads: int | None = None
    kv_heads: int | None = None
    output_transposed: bool = False
