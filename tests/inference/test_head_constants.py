"""Tables that meet attention scores, rule by rule, on minimal graphs.

* A constant that differs from head to head, added to the scores (ALiBi's slopes times
  the distance) or multiplying them (a temperature per head), fixes the heads' order:
  no head space, one line saying where; the bases inside each head stay, a space per
  head. Without it the heads permute.
* A table of constants that several layers read (T5 hands one mask of zeros to every
  cross-attention) leaves each layer's heads their own permutation; a learned table
  they all read (T5's relative position bias) ties their heads into one space.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.inference import analyze_symmetries, check_spec

HEADS, HEAD_DIM, WIDTH, T = 4, 3, 8, 5


class Attention(nn.Module):
    """Heads written out: ``softmax(q k^T / sqrt(d) [+ slope_h * distance | * temp_h]) v``."""

    def __init__(self, table: str | None) -> None:
        super().__init__()
        self.table = table
        self.q, self.k, self.v = (nn.Linear(WIDTH, HEADS * HEAD_DIM) for _ in range(3))
        self.o = nn.Linear(HEADS * HEAD_DIM, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = (
            p(x).view(b, t, HEADS, HEAD_DIM).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        slopes = 2.0 ** -torch.arange(1, HEADS + 1, dtype=x.dtype)
        if self.table == "alibi":
            distance = (
                torch.arange(t, dtype=x.dtype)[None, :] - torch.arange(t, dtype=x.dtype)[:, None]
            )
            scores = scores + slopes[:, None, None] * distance
        elif self.table == "temperature":
            scores = scores * (1 + slopes[:, None, None])
        out = scores.softmax(-1) @ v
        return x + self.o(out.transpose(1, 2).reshape(b, t, -1))


def _x() -> Tensor:
    return torch.randn(2, T, WIDTH, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("table", ["alibi", "temperature"])
def test_a_constant_per_head_fixes_their_order_and_keeps_their_bases(table: str) -> None:
    torch.manual_seed(0)
    module = Attention(table).eval()
    analysis = analyze_symmetries(module, (_x(),))
    assert not any(s.group.units(s.n) == HEADS for s in analysis.spec)
    assert any("fixed by a constant that differs from head to head" in x for x in analysis.left_out)
    for kind in ("qk", "value"):
        inside = [s for s in analysis.spec if s.inside is not None and s.inside.kind == kind]
        assert len(inside) == HEADS and all(s.n == HEAD_DIM for s in inside)
    assert check_spec(module, analysis.spec, (_x(),))["all"] < 1e-10


def test_without_a_table_the_heads_permute() -> None:
    torch.manual_seed(0)
    module = Attention(None).eval()
    analysis = analyze_symmetries(module, (_x(),))
    assert any(s.group.units(s.n) == HEADS and s.nest is None for s in analysis.spec)
    assert not any("fixed by a constant" in x for x in analysis.left_out)


class TwoLayers(nn.Module):
    """Two attention layers that read one table: a mask of zeros made in ``forward`` (a
    constant), or a learned parameter."""

    def __init__(self, learned: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleDict({p: nn.Linear(WIDTH, HEADS * HEAD_DIM) for p in "qkv"}) for _ in range(2)
        )
        self.outs = nn.ModuleList(nn.Linear(HEADS * HEAD_DIM, WIDTH) for _ in range(2))
        self.bias = nn.Parameter(torch.randn(HEADS, T, T)) if learned else None

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        table = self.bias if self.bias is not None else torch.zeros(1, HEADS, t, t)
        for layer, out in zip(self.layers, self.outs, strict=True):
            q, k, v = (layer[p](x).view(b, t, HEADS, HEAD_DIM).transpose(1, 2) for p in "qkv")
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask=table)
            x = x + out(heads.transpose(1, 2).reshape(b, t, -1))
        return x


@pytest.mark.parametrize(("learned", "spaces"), [(False, 2), (True, 1)])
def test_a_constant_table_read_by_two_layers_does_not_tie_their_heads(
    learned: bool, spaces: int
) -> None:
    torch.manual_seed(0)
    module = TwoLayers(learned).eval()
    spec = analyze_symmetries(module, (_x(),)).spec
    heads = [s for s in spec if s.group.units(s.n) == HEADS and s.nest is None]
    assert len(heads) == spaces
    assert {u.param for s in heads for u in s.uses} >= {"layers.0.q.weight", "layers.1.q.weight"}
