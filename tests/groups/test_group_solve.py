"""Solvers are the argmax of <T, C> (brute force on small problems), projections land
in the group, objectives are the trace inner product."""

from __future__ import annotations

import itertools

import pytest
import torch
from group_cases import CASES, Case

from lmckit.groups._head_permutation import HeadPermutation
from lmckit.groups._invertible import Invertible
from lmckit.groups._orthogonal import Orthogonal
from lmckit.groups._padded_permutation import PaddedPermutation, PaddedPermutationElement
from lmckit.groups._permutation import Permutation, sinkhorn
from lmckit.groups._rotary import RotaryPlanes
from lmckit.groups._semi_permutation import SemiPermutation, SemiPermutationElement


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _best(group, candidates, sim) -> float:
    return max(group.objective(c, sim) for c in candidates)


@pytest.mark.parametrize("seed", range(3))
def test_permutation_solver_is_the_brute_force_argmax(seed: int) -> None:
    sim = torch.randn(6, 6, generator=_gen(seed))
    perms = [torch.tensor(p) for p in itertools.permutations(range(6))]
    group = Permutation()
    assert group.objective(group.solve(sim), sim) == pytest.approx(_best(group, perms, sim))
    # a semi-permutation of equal widths is a permutation: the same optimum
    semi = SemiPermutation()
    found = semi.solve(sim)
    assert torch.equal(found.coef, torch.ones(6))
    assert semi.objective(found, sim) == pytest.approx(_best(group, perms, sim))


@pytest.mark.parametrize("seed", range(3))
def test_block_permutation_solver_is_the_argmax_over_block_permutations(seed: int) -> None:
    group = Permutation(blocks=2)
    sim = torch.randn(6, 6, generator=_gen(10 + seed))
    members = [
        torch.tensor(p)
        for p in itertools.permutations(range(6))
        if all(len({q // 3 for q in p[i : i + 3]}) == 1 for i in (0, 3))
    ]
    found = group.solve(sim)
    group.validate(found, 6)
    assert group.objective(found, sim) == pytest.approx(_best(group, members, sim))


def test_head_permutation_solver_is_the_argmax_over_head_permutations() -> None:
    group = HeadPermutation(heads=4, head_dim=2)
    sim = torch.randn(8, 8, generator=_gen(20))
    heads = [torch.tensor(p) for p in itertools.permutations(range(4))]
    assert group.objective(group.solve(sim), sim) == pytest.approx(_best(group, heads, sim))


@pytest.mark.parametrize("seed", range(3))
def test_padded_permutation_solver_is_the_argmax_over_injections(seed: int) -> None:
    group = PaddedPermutation()
    sim = torch.randn(5, 3, generator=_gen(30 + seed))
    injections = [
        PaddedPermutationElement(torch.tensor(s), 5) for s in itertools.permutations(range(5), 3)
    ]
    assert len(injections) == 60
    found = group.solve(sim)
    group.validate(found, 3)
    assert group.objective(found, sim) == pytest.approx(_best(group, injections, sim))


@pytest.mark.parametrize("m", [6, 9], ids=["square", "rectangular"])
def test_procrustes_meets_the_optimality_condition(m: int) -> None:
    # at the maximiser of tr(O^T C) over orthonormal columns, O^T C is symmetric PSD
    sim = torch.randn(m, 6, generator=_gen(40), dtype=torch.float64)
    found = Orthogonal().solve(sim).double()
    gram = found.T @ sim
    torch.testing.assert_close(gram, gram.T, atol=1e-5, rtol=0)
    assert float(torch.linalg.eigvalsh((gram + gram.T) / 2).min()) >= -1e-5
    best = Orthogonal().objective(found, sim)
    gen = _gen(41)
    draws = (Orthogonal().random(6, gen, m=m) for _ in range(200))
    assert all(Orthogonal().objective(o, sim) <= best + 1e-6 for o in draws)


def test_least_squares_solver_recovers_a_planted_invertible_map() -> None:
    # min_A ||A_ref - T B||: C = A_ref B^T, G = B B^T
    truth = Invertible().random(6, _gen(50)).double()
    b = torch.randn(6, 40, generator=_gen(51), dtype=torch.float64)
    found = Invertible().solve((truth @ b @ b.T).float(), gram=(b @ b.T).float())
    torch.testing.assert_close(found.double(), truth, atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="Gram"):
        Invertible().solve(torch.eye(3))


@pytest.mark.parametrize("coefficients", ["uniform", "similarity"])
def test_semi_permutation_solver_recovers_a_planted_split(coefficients: str) -> None:
    # wide writer rows are scaled copies of narrow rows: each copy is most alike its source
    group = SemiPermutation(coefficients)  # type: ignore[arg-type]
    planted = group.random(5, _gen(60), m=11)
    narrow = torch.randn(5, 30, generator=_gen(61), dtype=torch.float64)
    wide = planted.coef.double()[:, None] * narrow[planted.assign]
    sim = wide @ narrow.T
    found = group.solve(sim, norms=(wide.norm(dim=1), narrow.norm(dim=1)))
    group.validate(found, 5)
    assert torch.equal(found.assign, planted.assign)
    # every copy of a unit is equally alike it (cosine 1): the split is uniform
    counts = torch.bincount(planted.assign, minlength=5).float()
    torch.testing.assert_close(found.coef, 1 / counts[planted.assign])


def test_square_groups_refuse_rectangular_similarities() -> None:
    for group in (Permutation(), HeadPermutation(2, 3), Invertible()):
        with pytest.raises(ValueError, match="square"):
            group.solve(torch.randn(8, 6), gram=torch.eye(6))
    for group in (SemiPermutation(), PaddedPermutation(), Orthogonal()):
        with pytest.raises(ValueError, match="m >= n"):
            group.solve(torch.randn(4, 6))


def test_rectangular_groups_refuse_narrower_targets_everywhere() -> None:
    # solving, the plain embedding and a random draw all need m >= n
    for group in (SemiPermutation(), PaddedPermutation(), Orthogonal()):
        message = f"{group.name} embeds n=6 units into m >= n, got m=4"
        with pytest.raises(ValueError, match=message):
            group.solve(torch.randn(4, 6))
        with pytest.raises(ValueError, match=message):
            group.embedding(6, 4)
        with pytest.raises(ValueError, match=message):
            group.random(6, torch.Generator(), m=4)
        group.validate(group.random(6, torch.Generator()), 6)  # m defaults to n


def test_objective_is_the_trace_inner_product(case: Case) -> None:
    element = case.random(70)
    sim = torch.randn(case.m, case.n, generator=_gen(71))
    expected = float(torch.trace(case.group.matrix(element).T @ sim.double()))
    assert case.group.objective(element, sim) == pytest.approx(expected, rel=1e-6)


def test_projection_lands_in_the_group(case: Case) -> None:
    dense = torch.randn(case.m, case.n, generator=_gen(80))
    projected = case.group.project(dense)
    case.group.validate(projected, case.n)
    assert case.group.dims(projected) == (case.m, case.n)


def test_projection_is_the_nearest_element(case: Case) -> None:
    if not case.group.self_dual:
        pytest.skip("argmax <T, S> is the nearest element only for groups of one norm")
    element = case.random(90)
    noisy = case.group.matrix(element) + 0.05 * torch.randn(
        case.m, case.n, generator=_gen(91), dtype=torch.float64
    )
    projected = case.group.project(noisy)

    def dist(t: object) -> float:
        return float(torch.linalg.norm(case.group.matrix(t) - noisy))

    assert dist(projected) <= dist(element) + 1e-6
    gen = _gen(92)
    m = case.m if case.group.rectangular else None
    rivals = [case.group.random(case.n, gen, m=m) for _ in range(20)]
    assert all(dist(projected) <= dist(r) + 1e-6 for r in rivals)
    if not isinstance(case.group, Orthogonal | RotaryPlanes):  # discrete: noise keeps it
        assert case.group.close(projected, element)


def test_sinkhorn_relaxes_plain_permutations_only() -> None:
    logits = torch.randn(5, 5, generator=_gen(100))
    soft = Permutation().soft_matrix(logits, temperature=0.5, iters=50)
    assert soft is not None
    torch.testing.assert_close(soft.sum(0), torch.ones(5), atol=1e-4, rtol=0)
    torch.testing.assert_close(soft.sum(1), torch.ones(5), atol=1e-4, rtol=0)
    # as the temperature falls, the soft matrix sharpens to the hard projection
    sharp = sinkhorn(logits / 1e-3, 200)
    hard = Permutation().matrix(Permutation().project(logits)).float()
    torch.testing.assert_close(sharp, hard, atol=1e-3, rtol=0)
    for group in (Permutation(blocks=5), Orthogonal(), HeadPermutation(5, 1)):
        assert group.soft_matrix(logits, temperature=0.5, iters=5) is None
    with pytest.raises(ValueError, match="square"):
        sinkhorn(torch.randn(3, 4), 2)


def test_solvers_return_cpu_elements_of_the_right_type(case: Case) -> None:
    sim = torch.randn(case.m, case.n, generator=_gen(110))
    found = case.group.solve(sim, gram=torch.eye(case.n) * 3)
    mat = case.group.matrix(found)
    assert mat.device.type == "cpu"
    if isinstance(found, SemiPermutationElement | PaddedPermutationElement):
        assert type(found) is type(case.group.identity(case.n))


assert set(CASES)  # the cases module is shared with the algebra tests


def test_a_similarity_that_breaks_blocks_still_gets_a_block_permutation() -> None:
    group = Permutation(blocks=3)
    breaking = torch.tensor([0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11])
    perm = group.solve(Permutation().matrix(breaking).float())
    group.validate(perm, 12)
    for block in perm.reshape(3, 4):
        assert len(set((block // 4).tolist())) == 1


def test_the_call_site_functions_are_the_groups_solvers() -> None:
    from lmckit.aligners._solvers import objective, solve

    truth = Invertible().random(5, _gen(120)).double()
    b = torch.randn(5, 30, generator=_gen(121), dtype=torch.float64)
    sim, gram = (truth @ b @ b.T).float(), (b @ b.T).float()
    assert torch.equal(solve(Invertible(), sim, gram=gram), Invertible().solve(sim, gram=gram))
    perm_sim = torch.randn(7, 7, generator=_gen(122))
    found = solve(Permutation(), perm_sim)
    assert objective(Permutation(), found, perm_sim) == Permutation().objective(found, perm_sim)


def test_a_group_without_a_solver_cannot_be_made() -> None:
    from lmckit.groups import Group

    class Strange(Group):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Strange()  # type: ignore[abstract]


@pytest.mark.parametrize(("m", "n"), [(6, 6), (9, 5)])
def test_smooth_orthogonal_projection_is_the_polar_factor(m: int, n: int) -> None:
    group = Orthogonal()
    gen = _gen(m + n)
    q = group.random(n, gen, m=m)
    for dense in (q + 0.1 * torch.randn(m, n, generator=gen), torch.randn(m, n, generator=gen)):
        u, _, vh = torch.linalg.svd(dense.double(), full_matrices=False)
        if torch.linalg.cond(dense) < 10:  # Newton-Schulz needs no tiny singular value
            smooth = group.smooth_projection(dense)
            torch.testing.assert_close(smooth.double(), u @ vh, atol=1e-4, rtol=0)


def test_smooth_orthogonal_projection_has_the_tangent_gradient_at_a_rotation() -> None:
    """At an orthogonal Q the polar factor moves along Q skew(Q^T E): finite where the
    SVD's gradient is not (every singular value is 1)."""
    group = Orthogonal()
    gen = _gen(0)
    q = torch.linalg.qr(torch.randn(7, 7, generator=gen, dtype=torch.float64))[0]
    e = torch.randn(7, 7, generator=gen, dtype=torch.float64)
    _, moved = torch.autograd.functional.jvp(group.smooth_projection, (q,), (e,))
    qe = q.T @ e
    torch.testing.assert_close(moved, q @ (qe - qe.T) / 2, atol=1e-8, rtol=0)
    assert group.smooth_projection(q).requires_grad is False
    assert Permutation().smooth_projection(torch.eye(3)) is None
