"""Per-group solvers recover planted elements and maximise ``<T, C>`` exactly."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor

from lmckit.align.solvers import objective, solve
from lmckit.symmetry import (
    Group,
    HeadPermutation,
    Invertible,
    Orthogonal,
    Permutation,
    SemiPermutation,
    SemiPermutationElement,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _planted(group: Group, n: int, seed: int, noise: float = 0.1) -> tuple[Tensor, Tensor]:
    """A similarity whose best element is a known random one: ``C = 1.0 T + noise``."""
    truth = group.random(n, _gen(seed))
    sim = group.matrix(truth).float() + noise * torch.rand(n, n, generator=_gen(seed + 100))
    return truth, sim


def test_permutation_recovers_planted_permutation() -> None:
    truth, sim = _planted(Permutation(), 30, seed=0)
    assert torch.equal(solve(Permutation(), sim), truth)


def test_block_permutation_recovers_planted_and_respects_blocks() -> None:
    group = Permutation(blocks=3)
    truth, sim = _planted(group, 12, seed=1)
    assert torch.equal(solve(group, sim), truth)
    # a similarity that prefers a block-breaking permutation still gets a block answer
    breaking = torch.tensor([0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11])
    sim = Permutation().matrix(breaking).float()
    perm = solve(group, sim)
    for block in perm.reshape(3, 4):
        assert len(set((block // 4).tolist())) == 1


def test_block_permutation_is_optimal_among_block_permutations() -> None:
    group = Permutation(blocks=2)
    sim = torch.randn(6, 6, generator=_gen(2))
    best = max(
        objective(group, torch.tensor(p), sim)
        for p in itertools.permutations(range(6))
        if all(len({q // 3 for q in p[i : i + 3]}) == 1 for i in (0, 3))
    )
    assert objective(group, solve(group, sim), sim) == pytest.approx(best)


def test_permutation_is_optimal_by_brute_force() -> None:
    sim = torch.randn(6, 6, generator=_gen(3))
    best = max(
        objective(Permutation(), torch.tensor(p), sim) for p in itertools.permutations(range(6))
    )
    assert objective(Permutation(), solve(Permutation(), sim), sim) == pytest.approx(best)


def test_head_permutation_recovers_planted_heads() -> None:
    group = HeadPermutation(heads=5, head_dim=4)
    truth, sim = _planted(group, 20, seed=4)
    assert torch.equal(solve(group, sim), truth)


def test_semi_permutation_square_is_a_permutation() -> None:
    truth, sim = _planted(Permutation(), 10, seed=5)
    element = solve(SemiPermutation(), sim)
    assert isinstance(element, SemiPermutationElement)
    assert torch.equal(element.assign, truth)
    assert torch.equal(element.coef, torch.ones(10))
    wide = solve(SemiPermutation(), torch.rand(12, 10, generator=_gen(12)))
    SemiPermutation().validate(wide, 10)  # a rectangular similarity gives an embedding
    assert SemiPermutation().dims(wide) == (12, 10)


def _spd(n: int, seed: int) -> Tensor:
    g = torch.randn(n, n, generator=_gen(seed), dtype=torch.float64)
    return g @ g.T + torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("m", [8, 13], ids=["square", "rectangular"])
def test_procrustes_recovers_planted_orthogonal_map(m: int) -> None:
    # tr(O^T O_true S) with S symmetric positive definite peaks at O = O_true
    truth = Orthogonal().random(8, _gen(6), m=m).double()
    sim = (truth @ _spd(8, 7)).float()
    found = solve(Orthogonal(), sim)
    assert found.shape == (m, 8)
    torch.testing.assert_close(found.double(), truth, atol=1e-4, rtol=0)


def test_least_squares_recovers_planted_invertible_map() -> None:
    # weight matching's invertible step: min_A ||A_ref - T B||, C = A_ref B^T, G = B B^T
    truth = Invertible().random(6, _gen(8)).double()
    b = torch.randn(6, 40, generator=_gen(9), dtype=torch.float64)
    ref = truth @ b
    found = solve(Invertible(), (ref @ b.T).float(), gram=(b @ b.T).float())
    torch.testing.assert_close(found.double(), truth, atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="Gram"):
        solve(Invertible(), torch.eye(3))


@pytest.mark.parametrize(
    "group",
    [Permutation(), HeadPermutation(2, 3), Orthogonal(), Invertible()],
    ids=["perm", "heads", "orth", "inv"],
)
def test_objective_is_trace_inner_product(group: Group) -> None:
    element = group.random(6, _gen(10))
    sim = torch.randn(6, 6, generator=_gen(11))
    expected = float(torch.trace(group.matrix(element).T @ sim.double()))
    assert objective(group, element, sim) == pytest.approx(expected, rel=1e-6)


def test_a_group_without_a_solver_cannot_be_made() -> None:
    class Strange(Group):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Strange()  # type: ignore[abstract]
