"""Symmetry groups of hidden spaces: one module per group, one protocol for all.

Every group implements :class:`Group` (algebra, action on parameter axes, the
linear subproblem of weight matching, projection, membership). Aligners use only the
protocol, so a new group is one new module here.
"""

from lmckit.groups.base import Group, Role, Statistic
from lmckit.groups.centered_orthogonal import CenteredOrthogonal
from lmckit.groups.head_permutation import HeadPermutation
from lmckit.groups.invertible import Invertible
from lmckit.groups.orthogonal import Orthogonal
from lmckit.groups.padded_permutation import PaddedPermutation, PaddedPermutationElement
from lmckit.groups.permutation import Permutation, sinkhorn
from lmckit.groups.plane_signs import PlaneSigns
from lmckit.groups.rotary import RotaryPlanes
from lmckit.groups.scaling import Scaling
from lmckit.groups.semi_permutation import SemiPermutation, SemiPermutationElement

__all__ = [
    "CenteredOrthogonal",
    "Group",
    "HeadPermutation",
    "Invertible",
    "Orthogonal",
    "PaddedPermutation",
    "PaddedPermutationElement",
    "Permutation",
    "PlaneSigns",
    "Role",
    "RotaryPlanes",
    "Scaling",
    "SemiPermutation",
    "SemiPermutationElement",
    "Statistic",
    "sinkhorn",
]
