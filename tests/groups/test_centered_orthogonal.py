"""CenteredOrthogonal: the orthogonal maps that commute with a LayerNorm's mean subtraction."""

from __future__ import annotations

import pytest
import torch

from lmckit.groups import CenteredOrthogonal, Orthogonal


def _layer_norm(x: torch.Tensor) -> torch.Tensor:
    """Affine-free LayerNorm over the last axis, written from its definition."""
    centred = x - x.mean(dim=-1, keepdim=True)
    return centred / centred.pow(2).mean(dim=-1, keepdim=True).add(1e-5).sqrt()


def test_elements_commute_with_layer_norm_and_plain_rotations_do_not() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 7, generator=gen, dtype=torch.float64)
    for _ in range(3):
        q = CenteredOrthogonal().random(7, gen).double()
        torch.testing.assert_close(q @ q.T, torch.eye(7, dtype=torch.float64), atol=1e-6, rtol=0)
        torch.testing.assert_close(
            q.sum(dim=1), torch.ones(7, dtype=torch.float64), atol=1e-6, rtol=0
        )
        torch.testing.assert_close(_layer_norm(x @ q.T), _layer_norm(x) @ q.T, atol=1e-6, rtol=0)
    rotation = Orthogonal().random(7, gen).double()
    assert not torch.allclose(_layer_norm(x @ rotation.T), _layer_norm(x) @ rotation.T, atol=1e-2)


def test_permutations_are_elements() -> None:
    perm = torch.eye(6)[torch.tensor([3, 0, 5, 1, 4, 2])]
    CenteredOrthogonal().validate(perm, 6)  # raises if not


def test_solve_recovers_a_planted_element_and_beats_random_ones() -> None:
    group = CenteredOrthogonal()
    gen = torch.Generator().manual_seed(2)
    planted = group.random(9, gen).double()
    a = torch.randn(9, 30, generator=gen, dtype=torch.float64)
    sim = a @ (planted.T @ a).T  # C = A B^T for B = Q^T A: <Q, C> is maximal at Q
    torch.testing.assert_close(group.solve(sim).double(), planted, atol=1e-5, rtol=0)
    noise = torch.randn(9, 9, generator=gen, dtype=torch.float64)
    best = group.objective(group.solve(noise), noise)
    assert all(group.objective(group.random(9, gen), noise) <= best + 1e-9 for _ in range(200))


def test_smooth_projection_keeps_elements_and_lands_in_the_group() -> None:
    group = CenteredOrthogonal()
    gen = torch.Generator().manual_seed(3)
    q = group.random(8, gen)
    torch.testing.assert_close(group.smooth_projection(q), q, atol=1e-5, rtol=0)
    dense = q + 0.05 * torch.randn(8, 8, generator=gen)
    group.validate(group.smooth_projection(dense), 8)


def test_validate_names_what_is_wrong() -> None:
    group = CenteredOrthogonal()
    rotation = Orthogonal().random(5, torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match="moves the mean direction"):
        group.validate(rotation, 5)
    with pytest.raises(ValueError, match="square"):
        group.embedding(4, 6)
