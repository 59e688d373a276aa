"""Layers (:mod:`lmckit.inference._layers`): linear maps as contractions, convolutions,
products of two activations per slice, embeddings."""

from __future__ import annotations

import torch
from tests.inference.rules.graphs import Level, interpreted, param_axis, seeded, spaces
from torch import Tensor, nn

from lmckit.groups import Orthogonal


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(self.a(x))


def test_a_linear_layer_writes_its_rows_and_reads_its_columns() -> None:
    an = interpreted(TwoLinear(), torch.randn(2, 3))
    hidden = param_axis(an, "a.weight", 0)
    assert param_axis(an, "a.bias", 0) is hidden and param_axis(an, "b.weight", 1) is hidden
    assert an.roles[("a.weight", 0)] == {"write"} and an.roles[("b.weight", 1)] == {"read"}
    assert hidden.level == Level.ORTH  # nothing but linear maps touch it
    assert param_axis(an, "a.weight", 1).level == Level.FREE  # the input
    spec = spaces(seeded(TwoLinear()), torch.randn(5, 3))
    assert spec["a"].group == Orthogonal()


class Depthwise(nn.Module):
    """A channel-mixing convolution, then one filter per channel, then a reader."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Conv2d(2, 4, 1)
        self.depth = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.out = nn.Conv2d(4, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.depth(self.mix(x)))


def test_a_depthwise_convolution_moves_its_filters_with_their_channels() -> None:
    an = interpreted(Depthwise(), torch.randn(2, 2, 5, 5))
    channels = param_axis(an, "mix.weight", 0)
    assert param_axis(an, "depth.weight", 0) is channels
    assert channels.level == Level.PERM and an.roles[("depth.weight", 0)] == {"elementwise"}
    assert param_axis(an, "depth.weight", 2).level == Level.FREE  # kernel taps


class Bilinear(nn.Module):
    """Two activations multiplied per slice of a shared axis (attention heads)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(3, 2 * 4), nn.Linear(3, 2 * 4)

    def forward(self, x: Tensor) -> Tensor:
        q = self.q(x).view(x.shape[0], 2, 4)  # (tokens, heads, dims)
        k = self.k(x).view(x.shape[0], 2, 4)
        return torch.einsum("thd,shd->hts", q, k).softmax(-1).sum(0)


def test_a_product_per_slice_of_two_activations_makes_that_axis_heads() -> None:
    an = interpreted(Bilinear(), torch.randn(5, 3))
    heads, dims = an.lattice.leaves([param_axis(an, "q.weight", 0)])
    assert heads.heads and heads.level == Level.PERM
    assert not dims.heads and dims.level == Level.ORTH
    assert an.lattice.leaves([param_axis(an, "k.weight", 0)]) == [heads, dims]


class Embedded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.out = nn.Embedding(7, 4), nn.Linear(4, 2)

    def forward(self, ids: Tensor) -> Tensor:
        return self.out(self.embed(ids))


def test_an_embedding_pins_its_rows_and_writes_its_columns() -> None:
    an = interpreted(Embedded(), torch.randint(0, 7, (2, 3)))
    assert param_axis(an, "embed.weight", 0).level == Level.FREE
    assert an.roles[("embed.weight", 1)] == {"write"}
    assert param_axis(an, "embed.weight", 1) is param_axis(an, "out.weight", 1)
