"""Elementwise arithmetic (:mod:`lmckit.inference._elementwise`): sums, numbers added,
products with parameters, nonlinearities, squared norms, complex rotary views."""

from __future__ import annotations

import torch
from tests.inference.rules.graphs import Level, interpreted, level, param_axis, seeded, spaces
from tests.inference.rules.graphs import value as value_of
from torch import Tensor, nn


class Residual(nn.Module):
    """Two layers' outputs summed (then read): one space, a residual stream."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.out = nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.a(x) + self.b(x))


def test_a_sum_of_two_layers_is_one_residual_space_that_keeps_rotations() -> None:
    an = interpreted(Residual(), torch.randn(2, 3))
    a, b = param_axis(an, "a.weight", 0), param_axis(an, "b.weight", 0)
    assert a is b and a.residual and a.level == Level.ORTH
    assert an.roles[("a.weight", 0)] == {"write"} and an.roles[("b.bias", 0)] == {"write"}


class Shifted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.fc(x) + 1.0)


def test_a_number_added_to_every_unit_keeps_the_maps_that_fix_the_mean() -> None:
    an = interpreted(Shifted(), torch.randn(2, 3))
    assert param_axis(an, "fc.weight", 0).level == Level.CENTERED


class Scaled(nn.Module):
    """A parameter vector times the features (a norm's scale) before a reader."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.scale, self.out = (
            nn.Linear(3, 4),
            nn.Parameter(torch.ones(4)),
            nn.Linear(4, 2),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.fc(x) * self.scale)


def test_a_parameter_scaling_each_unit_keeps_permutations_and_is_a_foldable_scale() -> None:
    an = interpreted(Scaled(), torch.randn(2, 3))
    assert param_axis(an, "fc.weight", 0).level == Level.PERM
    assert an.roles[("scale", 0)] == {"elementwise"}
    assert [(site.node, site.weight) for site in an.scales] == [("mul", "p_scale")]


class Activated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(torch.relu(self.fc(x)))


def test_an_activation_keeps_permutations_only() -> None:
    an = interpreted(Activated(), torch.randn(2, 3))
    assert param_axis(an, "fc.weight", 0).level == Level.PERM
    assert any("acts unit by unit" in r for r in param_axis(an, "fc.weight", 0).reasons)


class Normalised(nn.Module):
    """``x / rms(x)`` written out: a squared norm is invariant under rotations."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x)
        return self.out(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_scaling_by_a_squared_norm_keeps_rotations() -> None:
    an = interpreted(Normalised(), torch.randn(2, 3))
    assert param_axis(an, "fc.weight", 0).level == Level.ORTH


class LogitScale(nn.Module):
    """Swin-v2's per-head logit scale: clamped, exponentiated, times each head's scores."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(4, 8), nn.Linear(4, 8)
        self.logit_scale = nn.Parameter(torch.randn(2, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        q = self.q(x).view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
        k = self.k(x).view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) * self.logit_scale.clamp(max=4.0).exp()
        return scores.softmax(-1).sum(1)


def test_a_function_of_a_parameter_unit_by_unit_keeps_its_provenance() -> None:
    an = interpreted(LogitScale(), torch.randn(2, 3, 4))
    assert an.roles[("logit_scale", 0)] == {"elementwise"}
    heads = an.lattice.leaves([param_axis(an, "q.weight", 0)])[0]
    assert param_axis(an, "logit_scale", 0) is heads
    spec = spaces(seeded(LogitScale()), torch.randn(2, 3, 4))
    heads = next(s for s in spec if s.nest is None and s.group.units(s.n) == 2)
    assert ("logit_scale", 0) in {(u.param, u.axis) for u in heads.uses}


class ComplexRotary(nn.Module):
    """Rotary positions written with complex numbers (DeepSeek-V2): pairs of features
    read as complex numbers, multiplied by unit phases, read back as pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(3, 2 * 4), nn.Linear(8, 2)
        angles = torch.arange(5)[:, None] * torch.tensor([1.0, 0.1, 0.3, 0.7])
        self.register_buffer("phase", torch.polar(torch.ones_like(angles), angles), False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x).view(x.shape[0], x.shape[1], 2, 4)  # (batch, time, heads, dims)
        pairs = torch.view_as_complex(h.float().reshape(*h.shape[:-1], -1, 2))
        turned = torch.view_as_real(pairs * self.phase[None, :, None, :2]).flatten(-2)
        return self.out(turned.flatten(-2))


def test_complex_rotary_pins_the_pairs_and_leaves_the_heads_alone() -> None:
    an = interpreted(ComplexRotary(), torch.randn(2, 5, 3))
    rows = an.lattice.leaves([param_axis(an, "fc.weight", 0)])
    assert [v.size for v in rows] == [2, 2, 2]  # heads, pairs, the pair's two entries
    heads, pairs, entries = rows
    assert heads.level > Level.FREE and pairs.level == entries.level == Level.FREE
    assert not any("not understood" in note for note in an.notes)
    assert level(an, value_of(an, "view_as_real").axes[-1]) == Level.FREE


class MaskToken(nn.Module):
    """A learned token put where a mask marks positions (DINOv2's embeddings): the stream
    times ``1 - mask`` plus the token times the mask, the mask one number per position."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.randn(4))
        self.embed, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        h = self.embed(x)
        if mask is not None:
            m = mask.unsqueeze(-1).type_as(h)
            h = h * (1 - m) + self.token * m
        return self.head(torch.relu(h))


def test_a_parameter_scaled_by_a_value_broadcast_along_its_axis_is_still_that_parameter() -> None:
    mask = torch.tensor([[True, False, False], [False, False, True]])
    an = interpreted(MaskToken(), torch.randn(2, 3, 3), mask)
    assert param_axis(an, "token", 0) is param_axis(an, "embed.weight", 0)
    assert an.roles[("token", 0)] == {"write"}  # written into the stream, as a bias is
    (space,) = spaces(seeded(MaskToken()), torch.randn(2, 3, 3), mask)
    assert ("token", 0) in {(u.param, u.axis) for u in space.uses}


def test_a_parameter_no_traced_op_reads_is_reported_not_moved() -> None:
    an = interpreted(MaskToken(), torch.randn(2, 3, 3))  # no mask: the token is never read
    assert "token: read by no traced op on the example inputs, so it is in no space" in an.notes
    (space,) = spaces(seeded(MaskToken()), torch.randn(2, 3, 3))
    assert "token" not in {u.param for u in space.uses}
    assert not any("embed.weight" in note for note in an.notes)
