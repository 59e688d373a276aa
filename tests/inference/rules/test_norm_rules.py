"""Norms (:mod:`lmckit.inference._layers`): what LayerNorm, an RMSNorm's scale, GroupNorm and
BatchNorm leave a feature axis, and the scales recorded for folding."""

from __future__ import annotations

import torch
from tests.inference.rules.graphs import Level, interpreted, param_axis
from torch import Tensor, nn


class Normed(nn.Module):
    def __init__(self, norm: nn.Module, width: int = 4) -> None:
        super().__init__()
        self.fc, self.norm, self.out = nn.Linear(3, width), norm, nn.Linear(width, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.norm(self.fc(x)))


def test_layernorm_without_a_scale_keeps_the_maps_that_fix_the_mean() -> None:
    an = interpreted(Normed(nn.LayerNorm(4, elementwise_affine=False)), torch.randn(2, 3))
    assert param_axis(an, "fc.weight", 0).level == Level.CENTERED
    assert [site.kind for site in an.scales] == ["layer"]


def test_layernorms_scale_and_shift_move_unit_by_unit() -> None:
    an = interpreted(Normed(nn.LayerNorm(4)), torch.randn(2, 3))
    hidden = param_axis(an, "fc.weight", 0)
    assert hidden.level == Level.PERM
    assert param_axis(an, "norm.weight", 0) is hidden and param_axis(an, "norm.bias", 0) is hidden
    assert an.roles[("norm.weight", 0)] == {"elementwise"}
    assert [(s.weight, s.bias) for s in an.scales] == [("p_norm_weight", "p_norm_bias")]


def test_an_rms_norm_keeps_rotations_until_its_scale() -> None:
    an = interpreted(Normed(nn.RMSNorm(4, elementwise_affine=False)), torch.randn(2, 3))
    assert param_axis(an, "fc.weight", 0).level == Level.ORTH
    scaled = interpreted(Normed(nn.RMSNorm(4)), torch.randn(2, 3))
    assert param_axis(scaled, "fc.weight", 0).level == Level.PERM
    assert [s.kind for s in scaled.scales] == ["rms"]


class Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.out = nn.Conv2d(2, 6, 1), nn.GroupNorm(3, 6), nn.Conv2d(6, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.norm(self.conv(x)))


def test_groupnorm_moves_units_in_their_groups() -> None:
    an = interpreted(Grouped(), torch.randn(2, 2, 3, 3))
    channels = param_axis(an, "conv.weight", 0)
    assert channels.level == Level.PERM and channels.blocks == 3


def test_batchnorm_moves_its_statistics_with_the_channels() -> None:
    module = nn.Sequential(nn.Conv2d(2, 4, 1), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1)).eval()
    an = interpreted(module, torch.randn(2, 2, 3, 3))
    channels = param_axis(an, "0.weight", 0)
    assert channels.level == Level.PERM
    assert param_axis(an, "1.running_mean", 0) is channels
    assert an.roles[("1.running_var", 0)] == {"elementwise"}
