"""RotaryPlanes: the maps of a query/key basis that commute with rotary embeddings."""

from __future__ import annotations

import math

import pytest
import torch

from lmckit.groups import RotaryPlanes


def _rope(n: int, rotary: int, interleaved: bool, position: float) -> torch.Tensor:
    """The rotary embedding at ``position`` as an ``(n, n)`` matrix, written from the
    definition (plane ``p`` turned by ``position / 10000^(2p / rotary)``), not from the
    group's code."""
    out = torch.eye(n, dtype=torch.float64)
    half = rotary // 2
    for p in range(half):
        i, j = (2 * p, 2 * p + 1) if interleaved else (p, p + half)
        angle = position / 10000 ** (2 * p / rotary)
        c, s = math.cos(angle), math.sin(angle)
        out[i, i], out[j, j], out[i, j], out[j, i] = c, c, -s, s
    return out


@pytest.mark.parametrize(
    "n, rotary, interleaved", [(8, 8, False), (8, 8, True), (10, 4, False), (7, 4, True)]
)
def test_elements_commute_with_the_rotary_embedding(n: int, rotary: int, interleaved: bool) -> None:
    group = RotaryPlanes(rotary, interleaved)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        r = group.matrix(group.random(n, gen))
        for position in (1.0, 5.0, 37.0):
            rope = _rope(n, rotary, interleaved, position)
            torch.testing.assert_close(r @ rope, rope @ r, atol=1e-6, rtol=0)
        # scores q.k with the rotary embedding at two positions survive k -> R k, q -> R q
        q, k = (
            torch.randn(n, generator=gen, dtype=torch.float64),
            torch.randn(n, generator=gen, dtype=torch.float64),
        )
        score = (_rope(n, rotary, interleaved, 3.0) @ q) @ (_rope(n, rotary, interleaved, 9.0) @ k)
        moved = (_rope(n, rotary, interleaved, 3.0) @ r @ q) @ (
            _rope(n, rotary, interleaved, 9.0) @ r @ k
        )
        assert float(moved) == pytest.approx(float(score), abs=1e-6)


def test_the_other_layout_does_not_commute() -> None:
    r = RotaryPlanes(8, interleaved=True).random(8, torch.Generator().manual_seed(1)).double()
    rope = _rope(8, 8, False, 2.0)
    assert not torch.allclose(r @ rope, rope @ r, atol=1e-3)


def test_solve_recovers_a_planted_element_and_beats_random_ones() -> None:
    group = RotaryPlanes(6)
    gen = torch.Generator().manual_seed(2)
    planted = group.random(9, gen)
    # C = A B^T for B = R^T A: the objective <R, C> is maximal at the planted R
    a = torch.randn(9, 30, generator=gen, dtype=torch.float64)
    sim = a @ (planted.double().T @ a).T
    found = group.solve(sim)
    torch.testing.assert_close(found.double(), planted.double(), atol=1e-5, rtol=0)
    noise = torch.randn(9, 9, generator=gen, dtype=torch.float64)
    best = group.objective(group.solve(noise), noise)
    assert all(group.objective(group.random(9, gen), noise) <= best + 1e-9 for _ in range(200))


def test_validate_names_what_is_wrong() -> None:
    group = RotaryPlanes(4)
    reflection = torch.eye(4)
    reflection[0, 0] = -1.0
    with pytest.raises(ValueError, match="not a rotation of each rotary plane"):
        group.validate(reflection, 4)
    with pytest.raises(ValueError, match="even number of rotary dims"):
        RotaryPlanes(3)
