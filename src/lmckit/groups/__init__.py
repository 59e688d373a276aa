"""Symmetry groups of hidden spaces: one module per group, one protocol for all.

Every group implements :class:`Group` (algebra, action on parameter axes, the
linear subproblem of weight matching, projection, membership). Aligners use only the
protocol, so a new group is one new module here.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.groups._base import Group
    from lmckit.groups._centered_orthogonal import CenteredOrthogonal
    from lmckit.groups._head_permutation import HeadPermutation
    from lmckit.groups._invertible import Invertible
    from lmckit.groups._orthogonal import Orthogonal
    from lmckit.groups._padded_permutation import PaddedPermutation
    from lmckit.groups._permutation import Permutation
    from lmckit.groups._plane_signs import PlaneSigns
    from lmckit.groups._rotary import RotaryPlanes
    from lmckit.groups._scaling import Scaling
    from lmckit.groups._semi_permutation import SemiPermutation

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
