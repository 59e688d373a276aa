"""Slicing and joining (:mod:`lmckit.inference._slicing`): blocks of a variable, the same
blocks glued back, concatenations along features (a direct sum of the parts' spaces)
and along tokens, picked features, rows of a parameter looked up by index."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.inference.rules.graphs import (
    Level,
    blocks,
    interpreted,
    leaves,
    node,
    param_axis,
    same,
    seeded,
    spaces,
    value,
)
from torch import Tensor, nn

from lmckit.groups import Permutation
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._transform import Part


class Blocks(nn.Module):
    """One projection cut into two blocks by slices, each read by its own layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fused, self.a, self.b = nn.Linear(4, 5), nn.Linear(3, 2), nn.Linear(2, 2)

    def forward(self, x: Tensor) -> Tensor:
        y = self.fused(x)
        return self.a(y[..., :3]) + self.b(y[..., 3:])


def test_slices_of_one_variable_are_blocks_each_of_its_own() -> None:
    an = interpreted(Blocks(), torch.randn(2, 4))
    found = blocks(an, value(an, "linear").axes[-1])
    assert found is not None and [(start, v.size) for start, v in found] == [(0, 3), (3, 2)]
    first, second = (v for _, v in found)
    assert first is not second and first.level == second.level == Level.ORTH
    spec = spaces(seeded(Blocks()), torch.randn(3, 4))
    parts = {u.parts for s in spec for u in s.uses if u.param == "fused.weight"}
    assert parts == {(Part(0, 0, 3),), (Part(0, 3, 2),)}


class Regathered(nn.Module):
    """Two slices of one projection glued back in order (a head's rotary and
    pass-through dimensions): the projection's own axis again."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(4, 6), nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        y = self.fc(x)
        return self.out(torch.cat([y[..., :2] * 2.0, y[..., 2:]], dim=-1))


def test_blocks_glued_back_in_order_are_the_whole_variable() -> None:
    an = interpreted(Regathered(), torch.randn(2, 4))
    assert same(an, value(an, "cat").axes[-1], value(an, "linear").axes[-1])


class TwoBranches(nn.Module):
    """Two layers' units side by side along the features, read by one layer."""

    def __init__(self) -> None:
        super().__init__()
        self.left, self.right, self.head = nn.Linear(4, 3), nn.Linear(4, 2), nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        both = torch.cat([torch.relu(self.left(x)), torch.tanh(self.right(x))], dim=-1)
        return self.head(both)


def test_a_concatenation_along_features_is_the_direct_sum_of_the_parts() -> None:
    an = interpreted(TwoBranches(), torch.randn(2, 4))
    found = blocks(an, value(an, "cat").axes[-1])
    assert found is not None
    assert [v for _, v in found] == [param_axis(an, "left.weight", 0),
                                     param_axis(an, "right.weight", 0)]  # fmt: skip
    assert all(v.level == Level.PERM for _, v in found)  # each block: an activation's
    spec = spaces(seeded(TwoBranches()), torch.randn(3, 4))
    reads = {s.name: [u.parts for u in s.uses if u.param == "head.weight"] for s in spec}
    assert reads == {"left": [(Part(1, 0, 3),)], "right": [(Part(1, 3, 2),)]}
    assert all(s.group == Permutation() for s in spec)


class ClassTokenBesideMean(nn.Module):
    """Dinov2's classifier: the first token beside the mean of the others, concatenated
    along the features, then one linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Linear(3, 4), nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        return self.head(torch.cat([h[:, 0], h[:, 1:].mean(dim=1)], dim=-1))


def test_two_copies_of_one_space_split_the_readers_columns_into_blocks_moved_alike() -> None:
    an = interpreted(ClassTokenBesideMean(), torch.randn(2, 5, 3))
    stream = param_axis(an, "embed.weight", 0)
    found = blocks(an, value(an, "cat").axes[-1])
    assert found == [(0, stream), (4, stream)]
    spec = spaces(seeded(ClassTokenBesideMean()), torch.randn(2, 5, 3))
    space = spec["embed"]
    assert space.group.name == "Orthogonal"  # linear all the way: any rotation
    assert [u.parts for u in space.uses if u.param == "head.weight"] == [
        (Part(1, 0, 4),),
        (Part(1, 4, 4),),
    ]


class ClassToken(nn.Module):
    """A learned token put before the patches (a concatenation along tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, 4))
        self.embed, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        h = torch.cat([self.token.expand(h.shape[0], -1, -1), h], dim=1)
        return self.head(torch.relu(h[:, 0]))


def test_a_concatenation_along_tokens_makes_the_features_one_space() -> None:
    an = interpreted(ClassToken(), torch.randn(2, 5, 3))
    assert same(an, [param_axis(an, "token", 2)], [param_axis(an, "embed.weight", 0)])
    spec = spaces(seeded(ClassToken()), torch.randn(2, 5, 3))
    (space,) = spec
    assert {(u.param, u.role) for u in space.uses} >= {
        ("token", "write"),
        ("embed.weight", "write"),
    }


class PickedFeature(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x)[..., 1]


def test_a_picked_feature_pins_its_axis_and_says_so() -> None:
    an = interpreted(PickedFeature(), torch.randn(2, 3))
    assert param_axis(an, "fc.weight", 0).level == Level.FREE
    assert any("picks a feature" in note for note in an.notes)


class Table(nn.Module):
    """Rows of a table looked up by a constant index (a relative position table): the
    looked-up value still holds the table's columns."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, 3))
        self.register_buffer("index", torch.tensor([4, 0, 2, 2]), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.table[self.index]


def test_rows_looked_up_by_index_keep_the_tables_columns() -> None:
    an = interpreted(Table(), torch.randn(2, 4, 3))
    looked_up = value(an, "index")
    assert looked_up.src[-1] == frozenset({("table", 1)})
    assert looked_up.src[0] == frozenset()  # rows are positions: pinned, and no note
    assert param_axis(an, "table", 0).level == Level.FREE
    assert not any("indexes a feature axis" in note for note in an.notes)


class BlocksAfterPinnedHeads(nn.Module):
    """A projection viewed as (heads, features), its heads pinned by a constant per head,
    its features cut into two blocks; one block read by a layer. No space of that block
    holds the projection's rows (the heads in front are pinned): it must be pinned, not
    proposed with the reader's columns alone."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 2 * 7), nn.Linear(2 * 4, 5)

    def forward(self, x: Tensor) -> Tensor:
        y = self.a(x).view(x.shape[0], 2, 7) * torch.tensor([1.0, 2.0]).view(1, 2, 1)
        first, second = torch.split(y, [3, 4], dim=-1)
        return self.b(torch.relu(second).reshape(x.shape[0], 8)) + first.sum((1, 2))[:, None]


def test_blocks_behind_a_pinned_factor_are_pinned_not_half_moved() -> None:
    analysis = analyze_symmetries(seeded(BlocksAfterPinnedHeads()), torch.randn(4, 6))
    assert not [line for line in analysis.left_out if "changes the outputs" in line]
    assert "b" not in analysis.spec.names


class UnboundQKV(nn.Module):
    """A fused projection viewed as (3, heads, head_dim) and unbound into query, key and
    value (ModernBERT), or as (heads, 3, head_dim), each head's three blocks side by side;
    each entry read by a scaled-dot-product attention's heads."""

    def __init__(self, heads_first: bool = False, heads: int = 2, dim: int = 3) -> None:
        super().__init__()
        self.heads_first, self.heads, self.dim = heads_first, heads, dim
        self.qkv, self.o = nn.Linear(4, 3 * heads * dim), nn.Linear(heads * dim, 4)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        if self.heads_first:
            q, k, v = self.qkv(x).view(b, t, self.heads, 3, self.dim).unbind(dim=3)
        else:
            q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.dim).unbind(dim=-3)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2))  # fmt: skip
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("heads_first", [False, True])
def test_unbound_entries_of_a_fused_projection_are_blocks_each_with_its_heads(
    heads_first: bool,
) -> None:
    an = interpreted(UnboundQKV(heads_first), torch.randn(2, 3, 4))
    unbound = an.values[node(an, "unbind").name]
    q, k, v = (leaves(an, [*part.axes[2], *part.axes[3]]) for part in unbound)
    assert q[0].heads and q[0] is k[0] is v[0]  # one head permutation moves all three
    assert q[1] is k[1] and v[1] is not q[1]  # queries and keys share a basis, values not
    assert not any("unevenly" in note for note in an.notes)
    spec = spaces(seeded(UnboundQKV(heads_first)), torch.randn(2, 3, 4))
    (parent,) = [s for s in spec if s.name.startswith("heads") and s.nest is None]
    assert parent.group.units(parent.n) == 2
    kinds = sorted({s.nest.kind for s in spec.nested_in(parent.name) if s.nest is not None})
    assert kinds == ["qk", "value"]
    # the head circuits name each entry's rows: blocks of the whole, or inside each head
    assert parent.circuits is not None
    parts = (parent.circuits.query, parent.circuits.key, parent.circuits.value)
    assert [(p.param, p.block, p.blocks, p.per_head) for p in parts] == [
        ("qkv.weight", i, 3, heads_first) for i in range(3)
    ]
    rows = torch.arange(18)
    if heads_first:  # head h's rows 9h..9h+8: its query, key and value rows
        assert rows[parts[1].index(18, 2)].tolist() == [3, 4, 5, 12, 13, 14]
    else:
        assert rows[parts[1].index(18, 2)].tolist() == list(range(6, 12))
