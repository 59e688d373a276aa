"""Group laws: elements are their matrices, compose and invert like them, act like them."""

from __future__ import annotations

import pytest
import torch
from group_cases import Case

from lmckit.groups import HeadPermutation, Invertible, Permutation, SemiPermutation
from lmckit.groups._base import MatrixGroup


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_identity_is_the_identity_matrix(case: Case) -> None:
    eye = torch.eye(case.n, dtype=torch.float64)
    identity = case.group.identity(case.n)
    torch.testing.assert_close(case.group.matrix(identity), eye)
    case.group.validate(identity, case.n)
    assert case.group.close(identity, identity)


def test_random_elements_are_members_and_differ_by_seed(case: Case) -> None:
    first, second = case.random(1), case.random(2)
    case.group.validate(first, case.n)
    assert case.group.dims(first) == (case.m, case.n)
    assert tuple(case.group.matrix(first).shape) == (case.m, case.n)
    assert not case.group.close(first, second)
    assert case.group.close(first, case.random(1))  # a seed gives one element


def test_compose_is_the_matrix_product(case: Case) -> None:
    group = case.group
    first = case.random(3)
    gen = _gen(4)
    # the second map starts where the first ends (m units) and may widen again
    second = group.random(case.m, gen, m=case.m + 2 if group.rectangular else None)
    product = group.matrix(second) @ group.matrix(first)
    torch.testing.assert_close(
        group.matrix(group.compose(second, first)), product, atol=1e-5, rtol=0
    )


def test_square_elements_invert_rectangular_ones_do_not(case: Case) -> None:
    element = case.random(5)
    if case.m != case.n:
        with pytest.raises(ValueError, match="inver|no inverse"):
            case.group.inverse(element)
        return
    eye = torch.eye(case.n, dtype=torch.float64)
    inv = case.group.matrix(case.group.inverse(element))
    torch.testing.assert_close(inv @ case.group.matrix(element), eye, atol=1e-5, rtol=0)
    torch.testing.assert_close(case.group.matrix(element) @ inv, eye, atol=1e-5, rtol=0)


def test_action_is_the_matrix_on_writers_and_a_left_inverse_on_readers(case: Case) -> None:
    group, element = case.group, case.random(6)
    x = torch.randn(2, case.n, 3, generator=_gen(7), dtype=torch.float64)
    mat, reader = group.matrix(element), group.reader_matrix(element)
    torch.testing.assert_close(group.act(x, element, "write"), torch.einsum("mn,onk->omk", mat, x))
    torch.testing.assert_close(
        group.act(x, element, "read"), torch.einsum("mn,onk->omk", reader, x)
    )
    # a reader R becomes R L with L T = I, so R L T x = R x: the function is kept
    eye = torch.eye(case.n, dtype=torch.float64)
    torch.testing.assert_close(reader.T @ mat, eye, atol=1e-6, rtol=0)
    if group.elementwise_ok:  # per-unit parameters follow the units
        torch.testing.assert_close(
            group.act(x, element, "elementwise"), torch.einsum("mn,onk->omk", mat, x)
        )
    else:
        with pytest.raises(ValueError, match="elementwise"):
            group.act(x, element, "elementwise")


def test_action_on_a_weight_read_along_its_columns_keeps_the_weight_row_major(
    case: Case,
) -> None:
    # symmetry.act_on_axis hands a weight acted on along axis 1 over as a transposed view
    group, element = case.group, case.random(6)
    weight = torch.randn(5, case.n, generator=_gen(8), dtype=torch.float64)
    x = weight.T.unsqueeze(0)
    out = group.act(x, element, "write")
    torch.testing.assert_close(out, torch.einsum("mn,onk->omk", group.matrix(element), x))
    if isinstance(group, MatrixGroup):  # dense products keep the weight's layout
        assert out[0].T.is_contiguous()


def test_self_dual_groups_read_with_the_element_itself(case: Case) -> None:
    element = case.random(8)
    same = torch.allclose(case.group.reader_matrix(element), case.group.matrix(element))
    # the claim learned matching relies on holds for every group that makes it, and
    # fails for the groups that do not (a split unit, a general invertible map)
    if case.group.self_dual:
        assert same
    elif case.m != case.n or case.group.least_squares:
        assert not same


def test_learnable_groups_read_a_dense_matrix_as_their_readers_do(case: Case) -> None:
    if not case.group.learned_by_inverse:
        return
    element = case.random(8)
    mat = case.group.matrix(element).requires_grad_()
    reader = case.group.dense_reader(mat)
    torch.testing.assert_close(reader.detach(), case.group.reader_matrix(element))
    reader.sum().backward()  # differentiable: learned matching follows its gradient
    assert mat.grad is not None and bool(torch.isfinite(mat.grad).all())


def test_embedding_is_a_member_of_the_wide_shape(case: Case) -> None:
    element = case.group.embedding(case.n, case.m)
    case.group.validate(element, case.n)
    assert case.group.dims(element) == (case.m, case.n)
    mat = case.group.matrix(element)
    # the narrow units survive: a left inverse recovers them
    eye = torch.eye(case.n, dtype=torch.float64)
    torch.testing.assert_close(case.group.reader_matrix(element).T @ mat, eye, atol=1e-6, rtol=0)
    if not case.group.rectangular:
        with pytest.raises(ValueError, match="square"):
            case.group.embedding(case.n, case.n + 1)


def test_semi_permutation_embedding_copies_unit_i_mod_n() -> None:
    element = SemiPermutation().embedding(3, 7)
    assert element.assign.tolist() == [0, 1, 2, 0, 1, 2, 0]
    torch.testing.assert_close(element.coef, torch.tensor([1 / 3, 1 / 2, 1 / 2] * 2 + [1 / 3]))


def test_block_permutations_map_blocks_onto_blocks() -> None:
    group = Permutation(blocks=4)
    for seed in range(5):
        perm = group.random(12, _gen(seed))
        # h'[i] = h[perm[i]]: the sources of each target block form one whole source block
        for block in perm.reshape(4, 3):
            assert len(set((block // 3).tolist())) == 1
    with pytest.raises(ValueError, match="blocks"):
        group.random(10, _gen(0))


def test_head_permutations_move_whole_heads() -> None:
    group = HeadPermutation(heads=4, head_dim=3)
    mat = group.matrix(group.random(12, _gen(5)))
    blocks = mat.reshape(4, 3, 4, 3).permute(0, 2, 1, 3)
    for i in range(4):
        for j in range(4):
            b = blocks[i, j]
            assert torch.equal(b, torch.zeros(3, 3, dtype=torch.float64)) or torch.equal(
                b, torch.eye(3, dtype=torch.float64)
            )
    with pytest.raises(ValueError, match="heads"):
        group.random(10, _gen(0))


def test_invertible_draws_are_well_conditioned() -> None:
    sv = torch.linalg.svdvals(Invertible().matrix(Invertible().random(5, _gen(7))))
    assert float(sv.min()) >= 0.5 - 1e-5 and float(sv.max()) <= 2 + 1e-5


@pytest.mark.parametrize("group", [Permutation(), HeadPermutation(2, 3), Invertible()])
def test_square_groups_refuse_rectangular_draws(group) -> None:
    with pytest.raises(ValueError, match="square"):
        group.random(6, _gen(0), m=8)


def test_with_options_sets_only_the_fields_a_group_has() -> None:
    assert SemiPermutation().with_options(coefficients="similarity") == SemiPermutation(
        "similarity"
    )
    assert Permutation(blocks=2).with_options(coefficients="similarity") == Permutation(blocks=2)
    with pytest.raises(ValueError, match="coefficients"):
        SemiPermutation(coefficients="nearest")  # type: ignore[arg-type]
