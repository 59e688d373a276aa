"""The random elements the symmetry check draws (:mod:`lmckit.inference._check`).

The check runs the module in float64 where it can, so a symmetry that holds leaves the
outputs equal to ~1e-12; an element that is only orthogonal to float32's ~1e-7 would
hide that. Elements are drawn from their group and, where they are orthogonal maps,
made orthogonal in float64 without losing the group's structure (rotary planes stay
planes).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmckit.symmetry._transform import Space

__all__ = ["polar", "random_check_element"]


#: draws of a random element that may be the identity before one that is not is kept
REDRAWS = 16


def random_check_element(space: Space, generator: torch.Generator) -> object:
    """A random element of ``space``'s group for the check, never the identity where the
    group has others (two heads are swapped, not left in place half of the time: the
    identity checks nothing): in float64 when it is a matrix, and orthogonal to
    float64's round-off when the group is orthogonal."""
    element = space.group.random(space.n, generator)
    for _ in range(REDRAWS):
        if not _is_identity(space, element):
            break
        element = space.group.random(space.n, generator)
    if isinstance(element, Tensor) and element.is_floating_point():
        element = element.double()
        if space.group.self_dual and not space.group.gathers:
            # an orthogonal map drawn in float32 is orthogonal to ~1e-7 only; the check
            # runs in float64
            element = polar(element)
    return element


def _is_identity(space: Space, element: object) -> bool:
    """Whether ``element`` is the identity: read off the units it moves (permutations),
    or off a small matrix (signs); a continuous group's draw never is."""
    if space.group.units(space.n) is not None:
        index = space.group.unit_index(element)
        return bool((index == torch.arange(len(index))).all())
    if isinstance(element, Tensor) and element.ndim == 2 and element.shape[0] <= 64:
        return bool(torch.equal(element, torch.eye(element.shape[0], dtype=element.dtype)))
    return False


def polar(x: Tensor, tol: float = 1e-13) -> Tensor:
    """The orthogonal polar factor of a nearly orthogonal ``x`` (square or batched), by
    Newton-Schulz steps ``X <- X (3 I - X^T X) / 2``: from float32's ~1e-7 two steps
    reach float64's round-off, two products each where an SVD of the residual's width
    costs several times more, and, like the SVD's ``U V^T``, they keep any block
    structure ``x`` has."""
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    y = x
    for _ in range(4):
        gram = y.mT @ y
        if float((gram - eye).abs().max()) <= tol:
            return y
        y = y @ (3 * eye - gram) / 2
    u, _, vh = torch.linalg.svd(x)  # not nearly orthogonal: the steps need not converge
    return u @ vh
