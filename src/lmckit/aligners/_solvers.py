"""Per-group solvers: the best group element for a similarity matrix.

Every aligner reduces one space to a similarity ``C`` of shape ``(m, n)`` between the
reference model's units (rows) and the other model's units (columns), e.g.
``C = sum_u A_u B_u^T`` over the space's uses, and asks for the element ``T`` that
maximises ``<T, C> = tr(T^T C)``. Each group answers that itself
(:meth:`lmckit.groups.Group.solve`); these functions are the call-site spelling.
"""

from __future__ import annotations

from typing import TypeVar

from torch import Tensor

from lmckit.groups import Group

__all__ = ["objective", "solve"]

E = TypeVar("E")


def solve(group: Group[E], sim: Tensor, *, gram: Tensor | None = None) -> E:
    """The element of ``group`` maximising ``<T, sim>`` (see :meth:`Group.solve`).

    Args:
        group: the space's group.
        sim: ``(m, n)`` similarity between reference units (rows) and other units.
        gram: ``(n, n)`` Gram matrix of the other model's writers, for least-squares
            groups (:class:`~lmckit.groups.Invertible`: ``T = sim gram^{-1}``).

    Returns:
        The element, on the CPU whatever ``sim``'s device.
    """
    return group.solve(sim, gram=gram)


def objective(group: Group[E], element: E, sim: Tensor) -> float:
    """``<T, sim>`` for an element of ``group``."""
    return group.objective(element, sim)
