"""Filling an axis (:mod:`lmckit.inference._filling`): padding, and copies into the blocks
of a tensor the graph has just made."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tests.inference.rules.graphs import Level, blocks, interpreted, param_axis, seeded, spaces
from tests.inference.rules.graphs import value as value_of
from torch import Tensor, nn

from lmckit.groups import Orthogonal
from lmckit.symmetry._transform import Part


class PaddedWindows(nn.Module):
    """Features of an image (batch, height, width, channels) padded along height and
    width to whole windows, as Swin does before cutting windows."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.fc(x))
        return self.out(F.pad(h, (0, 0, 0, 1, 0, 1))).mean((1, 2))


def test_padding_a_spatial_axis_leaves_the_features_alone() -> None:
    an = interpreted(PaddedWindows(), torch.randn(2, 3, 3, 3))
    assert param_axis(an, "fc.weight", 0).level == Level.PERM
    assert param_axis(an, "out.weight", 1) is param_axis(an, "fc.weight", 0)
    assert not any("pad" in note for note in an.notes)
    assert value_of(an, "pad").src[-1] == frozenset()  # an activation, not a parameter


class PaddedFeatures(nn.Module):
    """Constant entries put before and after the features, then read."""

    def __init__(self, mode: str = "constant") -> None:
        super().__init__()
        self.mode = mode
        self.fc, self.out = nn.Linear(3, 4), nn.Linear(7, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x)
        if self.mode == "constant":
            return self.out(F.pad(h, (1, 2), value=0.5))
        return self.out(F.pad(h[:, None], (1, 2), mode=self.mode)[:, 0])


def test_padding_a_feature_axis_is_a_direct_sum_with_pinned_blocks() -> None:
    an = interpreted(PaddedFeatures(), torch.randn(2, 3))
    found = blocks(an, value_of(an, "pad").axes[-1])
    assert found is not None
    assert [(start, v.size, v.level) for start, v in found] == [
        (0, 1, Level.FREE),
        (1, 4, Level.ORTH),
        (5, 2, Level.FREE),
    ]
    spec = spaces(seeded(PaddedFeatures()), torch.randn(5, 3))
    assert spec["fc"].group == Orthogonal()
    assert [u.parts for u in spec["fc"].uses if u.param == "out.weight"] == [(Part(1, 1, 4),)]


def test_reflecting_a_feature_axis_pins_it_and_says_so() -> None:
    an = interpreted(PaddedFeatures("reflect"), torch.randn(2, 3))
    assert param_axis(an, "fc.weight", 0).level == Level.FREE
    assert any("pads a feature axis" in note for note in an.notes)


class Filled(nn.Module):
    """A new tensor written block by block (DeepSeek's key: each head's own features
    beside the rotary features), then read; ``peek`` reads it half filled."""

    def __init__(self, peek: bool = False) -> None:
        super().__init__()
        self.peek = peek
        self.a, self.b, self.out = nn.Linear(4, 3), nn.Linear(4, 2), nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        a, b = torch.relu(self.a(x)), torch.relu(self.b(x))
        whole = a.new_empty(*a.shape[:-1], 5)
        whole[..., :3].copy_(a)
        early = whole.sum(-1, keepdim=True) if self.peek else 0.0
        whole[..., 3:].copy_(b)
        return self.out(whole) + early


def test_copies_into_the_blocks_of_a_new_tensor_glue_its_axis() -> None:
    an = interpreted(Filled(), torch.randn(2, 4))
    found = blocks(an, value_of(an, "new_empty").axes[-1])
    assert found == [(0, param_axis(an, "a.weight", 0)), (3, param_axis(an, "b.weight", 0))]
    spec = spaces(seeded(Filled()), torch.randn(5, 4))
    reads = {s.name: [u.parts for u in s.uses if u.param == "out.weight"] for s in spec}
    assert reads == {"a": [(Part(1, 0, 3),)], "b": [(Part(1, 3, 2),)]}


def test_a_tensor_read_half_filled_pins_what_was_copied_into_it() -> None:
    an = interpreted(Filled(peek=True), torch.randn(2, 4))
    assert param_axis(an, "a.weight", 0).level == Level.FREE
    assert param_axis(an, "b.weight", 0).level == Level.FREE
    assert any("copies into" in note for note in an.notes)
