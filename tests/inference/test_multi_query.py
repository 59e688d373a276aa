"""Multi-query attention written out by hand: every query head reads one key/value head.

The fused projection is viewed as ``[heads + 2, head_dim]`` and cut along its first axis
(query heads, the key head, the value head), as Falcon does. Besides the query heads'
permutation, the key/value head's value basis (undone on the output columns of every
query head) and its query/key basis (applied to the key head and to every query head)
are symmetries, one map shared by all heads; with ``scaled_dot_product_attention`` and
with the attention written out (the key head broadcast against the query heads in plain
products). The planted transforms below are written by hand, without lmckit's spec.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from tests.planters import distance, orthogonal, plane_rotation, rotary_tables, rotate_half
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.groups import Orthogonal, RotaryPlanes
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._params import module_params
from lmckit.symmetry._transform import HeadPermutation, Part, Space, SymmetrySpec, Use

HEADS, HEAD_DIM, WIDTH, T = 4, 6, 10, 5


class MultiQuery(nn.Module):
    """``x -> x + dense(attention(split(fused(x))))``, one key/value head."""

    def __init__(self, rotary: bool, eager: bool = False) -> None:
        super().__init__()
        self.eager = eager
        self.fused = nn.Linear(WIDTH, (HEADS + 2) * HEAD_DIM, bias=False)
        self.dense = nn.Linear(HEADS * HEAD_DIM, WIDTH, bias=False)
        self.rotary = rotary
        cos, sin = rotary_tables(HEAD_DIM, T)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        qkv = self.fused(x).view(b, t, HEADS + 2, HEAD_DIM)
        q, k, v = qkv[..., :-2, :], qkv[..., [-2], :], qkv[..., [-1], :]
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (b, heads, t, d)
        if self.rotary:
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
        if self.eager:  # written out: k and v broadcast against the query heads
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(HEAD_DIM)
            out = scores.softmax(-1) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v)  # k, v broadcast to every head
        return x + self.dense(out.transpose(1, 2).reshape(b, t, -1))


def _planted(params: dict[str, Tensor], rotary: bool, seed: int) -> dict[str, Tensor]:
    """B: query heads permuted, the value basis rotated, the query/key basis rotated (a
    rotation of each rotary plane with positions, any rotation without)."""
    gen = torch.Generator().manual_seed(seed)
    w = params["fused.weight"].double().view(HEADS + 2, HEAD_DIM, WIDTH)
    o = params["dense.weight"].double().view(WIDTH, HEADS, HEAD_DIM)
    perm = torch.randperm(HEADS, generator=gen)
    value = orthogonal(HEAD_DIM, gen)
    qk = plane_rotation(HEAD_DIM, gen) if rotary else orthogonal(HEAD_DIM, gen)
    q = torch.einsum("ij,hjk->hik", qk, w[:HEADS][perm])
    k, v = qk @ w[HEADS], value @ w[HEADS + 1]
    moved_o = torch.einsum("whj,ij->whi", o[:, perm], value)
    return {
        "fused.weight": torch.cat([q, k[None], v[None]]).reshape(-1, WIDTH).float(),
        "dense.weight": moved_o.reshape(WIDTH, -1).float(),
    }


@pytest.mark.parametrize("eager", [False, True], ids=["sdpa", "written-out"])
@pytest.mark.parametrize("rotary", [False, True], ids=["no-positions", "rotary"])
def test_the_shared_key_value_head_bases_are_found_and_a_planted_pair_recovered(
    rotary: bool, eager: bool
) -> None:
    torch.manual_seed(0)
    module = MultiQuery(rotary, eager).eval()
    x = torch.randn(2, T, WIDTH)
    analysis = analyze_symmetries(module, (x,))
    groups = {s.name: s.group for s in analysis.spec}
    assert isinstance(groups["heads.0"], HeadPermutation), analysis.report()
    assert isinstance(groups["heads.0.value"], Orthogonal), analysis.report()
    expected = RotaryPlanes if rotary else Orthogonal
    assert isinstance(groups["heads.0.qk"], expected), analysis.report()

    a = module_params(module)
    b = _planted(a, rotary, seed=1)
    torch.testing.assert_close(  # the planted map keeps the function: it is a symmetry
        functional_call(module, b, (x,)), functional_call(module, a, (x,)), atol=1e-5, rtol=0
    )
    result = weight_matching(analysis.spec, a, b, WeightMatchingConfig(max_iter=50))
    moved = result.apply(b)
    assert distance(a, moved) < 1e-4 * distance(a, b)


def test_a_space_alike_in_every_unit_shares_the_axis_of_the_unit_permutation() -> None:
    heads = Space("heads", HEADS * HEAD_DIM, HeadPermutation(HEADS, HEAD_DIM),
                  (Use("o", 1, "read"),))  # fmt: skip
    use = Use("o", 1, "read", outer=HEADS)
    inside = Space("inside", HEAD_DIM, Orthogonal(), (use,), within="heads")
    assert len(SymmetrySpec((heads, inside))) == 2  # the maps commute
    # without saying so, two spaces on one axis are refused
    with pytest.raises(ValueError, match="axis 1 of 'o' is used by both 'heads' and 'inside'"):
        SymmetrySpec((heads, replace(inside, within=None)))
    # a map across heads (not one block per head) does not commute with their order
    across = Space("across", HEAD_DIM, Orthogonal(), (Use("o", 1, "read", inner=HEADS),),
                   within="heads")  # fmt: skip
    with pytest.raises(ValueError, match="used by both 'heads' and 'across'"):
        SymmetrySpec((heads, across))
    # nor does one over a slice the heads' use does not cover alike
    part = (Part(1, 0, HEADS * HEAD_DIM),)
    sliced = replace(inside, name="sliced", uses=(replace(use, parts=part),))
    with pytest.raises(ValueError, match="used by both 'heads' and 'sliced'"):
        SymmetrySpec((heads, sliced))


def test_a_block_of_every_unit_alike_shares_the_axis_of_the_unit_permutation() -> None:
    # one use per head, the same rows of each (the rotary rows of latent attention)
    heads = Space("heads", HEADS * HEAD_DIM, HeadPermutation(HEADS, HEAD_DIM),
                  (Use("o", 1, "read"),))  # fmt: skip
    rows = [Use("o", 1, "read", parts=(Part(1, h * HEAD_DIM + 2, 2),)) for h in range(HEADS)]
    block = Space("block", 2, Orthogonal(), tuple(rows), within="heads")
    assert len(SymmetrySpec((heads, block))) == 2  # the maps commute
    # not every head, or not the same rows of each: the heads' order is not kept
    for uses in (rows[:-1], [*rows[:-1], Use("o", 1, "read", parts=(Part(1, 1, 2),))]):
        with pytest.raises(ValueError, match="used by both 'heads' and 'block'"):
            SymmetrySpec((heads, replace(block, uses=tuple(uses))))
