"""A constant index list along a feature axis (``x[..., [-2], :]``, as fused multi-query
projections are cut): consecutive entries are a block of the axis, like a slice; any
other list pins the axis and says so."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.aligners import weight_matching
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._params import module_params

#: the fused layer's rows: a block of 4 and a block of 8 (read by different layers)
FIRST, SECOND = [0, 1, 2, 3], list(range(4, 12))


class IndexedBlocks(nn.Module):
    """One fused layer whose output rows are taken by index lists into two branches."""

    def __init__(self, first: list[int], second: list[int]) -> None:
        super().__init__()
        self.fused = nn.Linear(6, 12)
        self.left, self.right = nn.Linear(len(first), 3), nn.Linear(len(second), 3)
        self.first, self.second = first, second

    def forward(self, x: Tensor) -> Tensor:
        z = torch.relu(self.fused(x))
        return self.left(z[..., self.first]) + self.right(z[..., self.second])


def _out(module: nn.Module, params: dict, x: Tensor) -> Tensor:
    return functional_call(module, params, (x,))


def test_consecutive_index_lists_cut_a_feature_axis_into_blocks() -> None:
    module = IndexedBlocks(FIRST, [-8, -7, -6, -5, -4, -3, -2, -1])  # negative: from the end
    analysis = analyze_symmetries(module, (torch.randn(5, 6),))
    blocks = {
        (u.parts[0].start, u.parts[0].length)
        for space in analysis.spec
        for u in space.uses
        if u.param == "fused.weight"
    }
    assert blocks == {(0, 4), (4, 8)}, analysis.report()
    assert not any("fused" in line for line in analysis.left_out)


def test_a_planted_permutation_of_each_block_is_recovered() -> None:
    torch.manual_seed(0)
    module = IndexedBlocks(FIRST, SECOND)
    spec = analyze_symmetries(module, (torch.randn(5, 6),)).spec
    a = module_params(module)
    # planted by hand: rows of each block of the fused layer, columns of its reader
    p1, p2 = torch.randperm(4), torch.randperm(8)
    rows = torch.cat([p1, 4 + p2])
    b = dict(a)
    b["fused.weight"], b["fused.bias"] = a["fused.weight"][rows], a["fused.bias"][rows]
    b["left.weight"], b["right.weight"] = a["left.weight"][:, p1], a["right.weight"][:, p2]
    x = torch.randn(7, 6)
    torch.testing.assert_close(_out(module, b, x), _out(module, a, x))  # same function
    aligned = weight_matching(spec, a, b).apply(b)
    for k in a:
        torch.testing.assert_close(aligned[k], a[k], rtol=0, atol=0)


def test_an_index_list_that_is_not_a_block_pins_the_axis() -> None:
    module = IndexedBlocks([0, 2, 4, 6], [1, 3, 5, 7, 8, 9, 10, 11])
    analysis = analyze_symmetries(module, (torch.randn(5, 6),))
    assert not any(u.param == "fused.weight" for s in analysis.spec for u in s.uses)
    assert any("indexes a feature axis" in line for line in analysis.left_out), analysis.left_out
