"""The random elements the symmetry check draws: orthogonal to float64's round-off, with
the structure of their group."""

from __future__ import annotations

import torch

from lmckit.groups import Orthogonal
from lmckit.groups._base import Group
from lmckit.groups._rotary import RotaryPlanes
from lmckit.inference._check_elements import polar, random_check_element
from lmckit.symmetry._spaces import Space, Use


def _space(group: Group, n: int) -> Space:
    return Space("s", n, group, (Use("w", 0, "write"),))


def test_orthogonal_elements_are_orthogonal_in_float64() -> None:
    element = random_check_element(_space(Orthogonal(), 96), torch.Generator().manual_seed(0))
    assert isinstance(element, torch.Tensor) and element.dtype == torch.float64
    error = (element.T @ element - torch.eye(96, dtype=torch.float64)).abs().max()
    assert float(error) < 1e-13


def test_rotary_elements_keep_their_planes() -> None:
    group = RotaryPlanes(rotary=8)
    drawn = group.random(12, torch.Generator().manual_seed(1))
    element = random_check_element(_space(group, 12), torch.Generator().manual_seed(1))
    assert isinstance(element, torch.Tensor)
    # the same draw, made orthogonal in float64, with exact zeros outside its planes
    assert torch.equal(element == 0, drawn.double() == 0)
    torch.testing.assert_close(element, drawn.double(), rtol=0, atol=1e-6)
    error = (element.T @ element - torch.eye(12, dtype=torch.float64)).abs().max()
    assert float(error) < 1e-13


def test_polar_factor_of_a_far_from_orthogonal_matrix_is_the_svd_one() -> None:
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    u, _, vh = torch.linalg.svd(x)
    torch.testing.assert_close(polar(x), u @ vh)
