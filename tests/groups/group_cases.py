"""Every group of lmckit.groups, square and rectangular, as test cases."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from lmckit.groups import (
    CenteredOrthogonal,
    Group,
    HeadPermutation,
    Invertible,
    Orthogonal,
    PaddedPermutation,
    Permutation,
    PlaneSigns,
    RotaryPlanes,
    Scaling,
    SemiPermutation,
)


class Case(NamedTuple):
    """A group acting on ``n`` units, its elements ``m x n``."""

    group: Group[Any]
    n: int
    m: int

    def random(self, seed: int) -> Any:
        gen = torch.Generator().manual_seed(seed)
        return self.group.random(self.n, gen, m=self.m if self.group.rectangular else None)


CASES = {
    "perm": Case(Permutation(), 6, 6),
    "perm-blocks": Case(Permutation(blocks=3), 6, 6),
    "heads": Case(HeadPermutation(heads=3, head_dim=2), 6, 6),
    "semi": Case(SemiPermutation(), 6, 6),
    "semi-wide": Case(SemiPermutation(), 4, 7),
    "padded": Case(PaddedPermutation(), 5, 5),
    "padded-wide": Case(PaddedPermutation(), 4, 7),
    "orth": Case(Orthogonal(), 6, 6),
    "orth-wide": Case(Orthogonal(), 4, 7),
    "centered": Case(CenteredOrthogonal(), 6, 6),
    "inv": Case(Invertible(), 6, 6),
    "rotary": Case(RotaryPlanes(6), 6, 6),
    "rotary-partial-interleaved": Case(RotaryPlanes(4, interleaved=True), 7, 7),
    "scaling": Case(Scaling(), 6, 6),
    "plane-signs": Case(PlaneSigns(4), 6, 6),
    "plane-signs-interleaved": Case(PlaneSigns(4, interleaved=True), 7, 7),
}
