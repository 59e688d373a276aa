"""Half turns of rotary planes: what of a query/key basis survives a norm with a weight.

Rotary embeddings keep the rotations of each plane (:class:`~lmckit.groups.RotaryPlanes`).
A norm of the queries and keys before them -- ``g * x / rms(x)`` over each head's
features (Qwen3) or over the whole projection (OLMo2) -- keeps a map ``Q`` of the
projection's rows only when ``diag(g) Q diag(g)^-1`` is orthogonal again (the ``rms`` is
invariant under orthogonal maps, the weight ``g`` is applied after it): for a weight
that differs from feature to feature, ``Q`` must commute with ``diag(g)``, a diagonal of
signs. Commuting with the rotary planes too leaves one sign per plane (a half turn,
``-1`` on both its dims) and one per dimension that passes through unrotated. The
weight itself stays as it is (a diagonal map commutes with a scale), so it is no use of
the space (:attr:`keeps_scales`); a shift after the norm would flip, and the check says
so.

Element: the dense ``(n, n)`` diagonal matrix of signs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor

from lmckit.groups._base import (
    MatrixGroup,
    Role,
    Subproblem,
    check_square,
    check_tensor,
    contract_units,
)
from lmckit.groups._rotary import plane_pairs

__all__ = ["PlaneSigns"]


@dataclass(frozen=True)
class PlaneSigns(MatrixGroup):
    """A sign per rotary plane (both its dims) and per unrotated dimension.

    Attributes:
        rotary: how many leading dimensions are rotary (even; 0: every dimension has its
            own sign).
        interleaved: planes pair neighbouring dimensions instead of the two halves.
    """

    rotary: int
    interleaved: bool = False

    elementwise_ok = False
    keeps_scales: ClassVar[bool] = True
    self_dual = True
    natural_statistic = "covariance"

    def __post_init__(self) -> None:
        if self.rotary < 0 or self.rotary % 2:
            raise ValueError(f"PlaneSigns needs an even number of rotary dims, got {self.rotary}")

    @cached_property
    def _pairs(self) -> Tensor:
        """``(rotary / 2, 2)``: the two dimensions of each plane."""
        return plane_pairs(self.rotary, interleaved=self.interleaved)

    def _check(self, n: int) -> None:
        if n < self.rotary:
            raise ValueError(f"{self.name}: {self.rotary} rotary dims in a space of {n}")

    def _assemble(self, n: int, planes: Tensor, rest: Tensor) -> Tensor:
        signs = torch.ones(n, dtype=torch.float64)
        signs[self._pairs[:, 0]] = planes.double()
        signs[self._pairs[:, 1]] = planes.double()
        signs[self.rotary :] = rest.double()
        return torch.diag(signs).float()

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        check_square(m, n, self)
        self._check(n)
        flips = torch.randint(0, 2, (self.rotary // 2 + n - self.rotary,), generator=generator)
        signs = 1.0 - 2.0 * flips.double()
        return self._assemble(n, signs[: self.rotary // 2], signs[self.rotary // 2 :])

    def inverse(self, element: Tensor) -> Tensor:
        return element.clone()

    def reader_matrix(self, element: Tensor) -> Tensor:
        return element.double()  # a diagonal of signs is its own inverse transpose

    def act(self, x: Tensor, element: Tensor, role: Role) -> Tensor:
        if role == "elementwise":
            raise ValueError(f"{self.name} has no elementwise uses (it keeps scales)")
        return contract_units(element.to(device=x.device, dtype=x.dtype), x)

    def solve_subproblem(self, problem: Subproblem) -> Tensor:
        sim = problem.sim.detach().cpu().double()
        n = sim.shape[0]
        check_square(sim.shape[0], sim.shape[1], self)
        self._check(n)
        diagonal = torch.diagonal(sim)
        i, j = self._pairs[:, 0], self._pairs[:, 1]
        planes = torch.where(diagonal[i] + diagonal[j] >= 0, 1.0, -1.0)
        rest = torch.where(diagonal[self.rotary :] >= 0, 1.0, -1.0)
        return self._assemble(n, planes, rest)

    def validate(self, element: object, n: int) -> None:
        mat = check_tensor(element, self, ndim=2, integer=False).double().cpu()
        if tuple(mat.shape) != (n, n):
            raise ValueError(f"{self.name} element has shape {tuple(mat.shape)}, the space has {n}")
        self._check(n)
        signs = torch.diagonal(mat)
        i, j = self._pairs[:, 0], self._pairs[:, 1]
        rebuilt = self._assemble(n, torch.sign(signs[i]), torch.sign(signs[self.rotary :]))
        deviation = float((rebuilt.double() - mat).abs().max()) if n else 0.0
        if not deviation <= 1e-6 or bool((signs[i] != signs[j]).any()):  # also catches NaN
            raise ValueError(
                f"{self.name} element is not a diagonal of signs, one per rotary plane and "
                f"per other dimension (deviation {deviation:.3g})"
            )
