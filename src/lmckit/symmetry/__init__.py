"""The algebra of symmetries: spaces, groups' elements acting on parameters, transforms.

A :class:`SymmetrySpec` is an architecture's symmetries as data: named hidden spaces,
each with a group (:mod:`lmckit.groups`) and the parameter axes it acts on (:class:`Use`;
a use may live in a slice of its parameter, :class:`Part`; a space may be nested in one
unit of another, :class:`Nest`). A :class:`Transform` is one group element per space;
:func:`apply` moves a parameter set by it. Parameter sets are flat state dicts
(:data:`Params`), and every function here is pure on them.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.symmetry._average import interpolate, weighted_average
    from lmckit.symmetry._draw import random_transform
    from lmckit.symmetry._params import (
        IncompatibleModelsError,
        Params,
        check_compatible,
        module_params,
    )
    from lmckit.symmetry._spaces import (
        CircuitPart,
        HeadCircuits,
        Nest,
        Part,
        Space,
        SymmetrySpec,
        Use,
    )
    from lmckit.symmetry._transform import Transform, apply

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
