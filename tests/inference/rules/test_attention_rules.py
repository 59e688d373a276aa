"""Attention (:mod:`lmckit.inference._layers`): the heads of a scaled-dot-product attention,
key/value heads shared by groups of query heads, and a bias per head added to the
scores from a relative position table."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tests.inference.rules.graphs import Level, interpreted, param_axis, seeded, spaces
from torch import Tensor, nn


class Attention(nn.Module):
    """``heads`` query heads of ``dim`` features; ``kv`` key/value heads, each read by
    ``heads / kv`` query heads; with ``table``, a relative position table adds one bias
    per head and pair of positions (Swin's windows)."""

    def __init__(self, heads: int = 4, kv: int = 4, dim: int = 2, table: bool = False) -> None:
        super().__init__()
        self.heads, self.kv, self.dim = heads, kv, dim
        self.q, self.k = nn.Linear(4, heads * dim), nn.Linear(4, kv * dim)
        self.v, self.o = nn.Linear(4, kv * dim), nn.Linear(heads * dim, 4)
        self.table = nn.Parameter(torch.randn(5, heads)) if table else None
        offsets = torch.arange(3)[:, None] - torch.arange(3)[None, :] + 2  # 3 positions
        self.register_buffer("index", offsets.reshape(-1), persistent=False)

    def _split(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        out = x.view(b, t, heads, self.dim).transpose(1, 2)
        if heads == self.heads:
            return out
        copies = self.heads // heads  # every key/value head read by its group of queries
        return out[:, :, None].expand(b, heads, copies, t, self.dim).reshape(b, -1, t, self.dim)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = self._split(self.q(x), self.heads), self._split(self.k(x), self.kv), \
            self._split(self.v(x), self.kv)  # fmt: skip
        bias = None
        if self.table is not None:
            bias = self.table[self.index].view(t, t, -1).permute(2, 0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


def test_attention_heads_move_whole_and_each_holds_its_own_bases() -> None:
    an = interpreted(Attention(), torch.randn(2, 3, 4))
    heads, dims = an.lattice.leaves([param_axis(an, "q.weight", 0)])
    assert heads.heads and heads.level == Level.PERM and dims.level == Level.ORTH
    spec = spaces(seeded(Attention()), torch.randn(2, 3, 4))
    (parent,) = [s for s in spec if s.name.startswith("heads") and s.nest is None]
    kinds = sorted({s.nest.kind for s in spec.nested_in(parent.name) if s.nest is not None})
    assert kinds == ["qk", "value"] and parent.group.units(parent.n) == 4


def test_key_value_heads_shared_by_query_heads_nest_the_query_heads() -> None:
    spec = spaces(seeded(Attention(heads=4, kv=2)), torch.randn(2, 3, 4))
    (parent,) = [s for s in spec if s.name.startswith("heads") and s.nest is None]
    assert parent.group.units(parent.n) == 2  # key/value groups
    kinds = {s.nest.kind for s in spec.nested_in(parent.name) if s.nest is not None}
    assert "query" in kinds  # the query heads of each group permute among themselves


def test_a_relative_position_table_moves_with_its_heads() -> None:
    an = interpreted(Attention(table=True), torch.randn(2, 3, 4))
    heads = an.lattice.leaves([param_axis(an, "q.weight", 0)])[0]
    assert param_axis(an, "table", 1) is heads and an.roles[("table", 1)] == {"write"}
    assert param_axis(an, "table", 0).level == Level.FREE  # relative positions
    spec = spaces(seeded(Attention(table=True)), torch.randn(2, 3, 4))
    (parent,) = [s for s in spec if s.name.startswith("heads") and s.nest is None]
    assert ("table", 1) in {(u.param, u.axis) for u in parent.uses}
