"""Membership checks: every corrupted element is refused with one clear line."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from group_cases import Case
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lmckit.groups import HeadPermutation, Invertible, Orthogonal, Permutation
from lmckit.groups._padded_permutation import PaddedPermutation, PaddedPermutationElement
from lmckit.groups._semi_permutation import SemiPermutation, SemiPermutationElement


def _orth(n: int, seed: int, m: int | None = None) -> torch.Tensor:
    return Orthogonal().random(n, torch.Generator().manual_seed(seed), m=m)


def _semi(assign: list[int], coef: list[float], n: int) -> SemiPermutationElement:
    return SemiPermutationElement(torch.tensor(assign), torch.tensor(coef), n)


BAD = {
    "perm-repeat": (Permutation(), 4, torch.tensor([0, 0, 2, 3]), "repeats an index"),
    "perm-short": (Permutation(), 4, torch.tensor([0, 2, 1]), "permutes 3 units, the space has 4"),
    "perm-range": (Permutation(), 3, torch.tensor([0, 1, 3]), r"outside \[0, 3\)"),
    "perm-float": (Permutation(), 3, torch.tensor([0.0, 1.0, 2.0]), "integer tensor"),
    "perm-bool": (Permutation(), 2, torch.tensor([True, False]), "integer tensor"),
    "perm-list": (Permutation(), 3, [0, 1, 2], "must be a 1-D integer tensor"),
    "perm-2d": (Permutation(), 4, torch.arange(4).reshape(2, 2), "1-D"),
    "blocks-split": (Permutation(blocks=2), 4, torch.tensor([0, 2, 1, 3]), "splits a block"),
    "heads-units": (HeadPermutation(2, 3), 6, torch.arange(6), "permutes 6 heads, the space has 2"),
    "heads-size": (HeadPermutation(2, 3), 5, torch.arange(2), "not 2 heads x 3"),
    "semi-type": (SemiPermutation(), 3, torch.arange(3), "must be a SemiPermutationElement"),
    "semi-negative": (
        SemiPermutation(),
        2,
        _semi([0, 1, 1], [1.0, 1.5, -0.5], 2),
        "positive and finite",
    ),
    "semi-sums": (
        SemiPermutation(),
        2,
        _semi([0, 1, 1], [1.0, 0.25, 0.25], 2),
        "unit 1 sums to 0.5",
    ),
    "semi-missing-unit": (
        SemiPermutation(),
        3,
        _semi([0, 1, 1], [1.0, 0.5, 0.5], 3),
        "unit 2 sums to 0",
    ),
    "semi-range": (SemiPermutation(), 2, _semi([0, 2], [1.0, 1.0], 2), r"outside \[0, 2\)"),
    "semi-n": (
        SemiPermutation(),
        4,
        _semi([0, 1, 2], [1.0] * 3, 3),
        "embeds 3 units, the space has 4",
    ),
    "semi-narrow": (SemiPermutation(), 3, _semi([0, 1], [1.0, 1.0], 3), "m >= n=3"),
    "padded-type": (PaddedPermutation(), 2, torch.arange(2), "must be a PaddedPermutationElement"),
    "padded-twice": (
        PaddedPermutation(),
        2,
        PaddedPermutationElement(torch.tensor([1, 1]), 4),
        "two units in one slot",
    ),
    "padded-range": (
        PaddedPermutation(),
        2,
        PaddedPermutationElement(torch.tensor([0, 4]), 4),
        r"outside \[0, 4\)",
    ),
    "padded-n": (
        PaddedPermutation(),
        3,
        PaddedPermutationElement(torch.tensor([0, 1]), 4),
        "places 2 units, the space has 3",
    ),
    "padded-m": (PaddedPermutation(), 3, PaddedPermutationElement(torch.arange(3), 2), "only m=2"),
    "orth-scaled": (Orthogonal(), 4, 1.01 * _orth(4, 0), r"max \|O\^T O - I\| = 0.0201"),
    "orth-entry": (Orthogonal(), 4, _orth(4, 1) + 0.1 * torch.eye(4)[0], "not orthogonal"),
    "orth-nan": (Orthogonal(), 2, torch.full((2, 2), float("nan")), "not orthogonal"),
    "orth-cols": (Orthogonal(), 4, _orth(3, 2, m=5), "acts on 3 units, the space has 4"),
    "orth-wide-rows": (Orthogonal(), 3, torch.eye(3)[:2], "into only m=2"),
    "orth-int": (Orthogonal(), 2, torch.eye(2, dtype=torch.long), "floating-point tensor"),
    "inv-singular": (Invertible(), 3, torch.ones(3, 3), "singular or ill-conditioned"),
    "inv-shape": (Invertible(), 3, torch.eye(4), r"shape \(4, 4\), the space needs \(3, 3\)"),
    "inv-inf": (Invertible(), 2, torch.tensor([[1.0, float("inf")], [0.0, 1.0]]), "singular"),
}


@pytest.mark.parametrize("key", BAD)
def test_corrupted_elements_are_refused_in_one_line(key: str) -> None:
    group, n, element, message = BAD[key]
    with pytest.raises(ValueError, match=message) as info:
        group.validate(element, n)
    assert "\n" not in str(info.value)


def test_generated_elements_pass(case: Case) -> None:
    for seed in range(5):
        case.group.validate(case.random(seed), case.n)
    m = case.m if case.group.rectangular else case.n
    case.group.validate(case.group.embedding(case.n, m), case.n)


def test_a_member_acting_on_another_width_is_refused(case: Case) -> None:
    wrong = case.n * 2
    with pytest.raises(ValueError, match=f"{wrong}"):
        case.group.validate(case.random(0), wrong)


def test_orthogonal_tolerance_accepts_float32_round_off() -> None:
    # products of float32 orthogonal maps drift by ~1e-7 per entry: still members
    gen = torch.Generator().manual_seed(4)
    o = torch.eye(64)
    for _ in range(20):
        o = o @ Orthogonal().random(64, gen)
    Orthogonal().validate(o, 64)


class _Ops(TorchDispatchMode):
    """Counts the tensor operations run inside it and the largest tensor they make."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.count += 1
        sizes = [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.largest = max([self.largest, *sizes])
        return out


def _validate_ops(n: int) -> _Ops:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    with _Ops() as ops:
        Permutation().validate(perm, n)
        Permutation(blocks=10).validate(torch.arange(n), n)
    return ops


def test_checking_a_large_permutation_is_linear_time() -> None:
    # a dense check would need an n x n matrix; the check makes nothing larger than the
    # permutation itself, with as many tensor operations for 10^6 units as for 10^3 (no
    # loop over units): linear time, counted rather than timed
    small, large = _validate_ops(1_000), _validate_ops(1_000_000)
    assert large.largest <= 1_000_000 and small.largest <= 1_000
    assert large.count == small.count
