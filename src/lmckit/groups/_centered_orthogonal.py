"""Orthogonal maps that fix the mean direction: the symmetry of a LayerNorm's stream.

A LayerNorm subtracts the mean of its units, ``x - (1^T x / n) 1``, so it commutes with
an orthogonal ``Q`` exactly when ``Q 1 = 1``: then ``1^T Q = 1^T`` too, the mean of
``Q x`` is the mean of ``x`` and the standard deviation is unchanged, so
``LN(Q x) = Q LN(x)`` for a LayerNorm without (or with folded) scale and shift. These maps
are ``H diag(1, R) H^T`` for an orthonormal basis ``H`` whose first vector is
``1 / sqrt(n)`` and any orthogonal ``R`` of the other ``n - 1`` dimensions: the
orthogonal group of the zero-mean subspace. It holds every permutation.

Element: the dense ``(n, n)`` orthogonal matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from lmckit.groups._base import Subproblem, check_square, check_tensor
from lmckit.groups._orthogonal import Orthogonal

__all__ = ["CenteredOrthogonal"]


def mean_basis(n: int) -> Tensor:
    """``(n, n)`` float64 orthonormal ``H`` with ``H[:, 0] = 1 / sqrt(n)``: the Householder
    reflection swapping ``e_1`` and the normalised ones vector (symmetric, ``H = H^T``)."""
    v = torch.full((n,), -1.0 / n**0.5, dtype=torch.float64)
    v[0] += 1.0
    norm = float(v @ v)
    if norm < 1e-24:  # n == 1: the ones vector is e_1
        return torch.eye(n, dtype=torch.float64)
    return torch.eye(n, dtype=torch.float64) - 2.0 * torch.outer(v, v) / norm


@dataclass(frozen=True)
class CenteredOrthogonal(Orthogonal):
    """Orthogonal maps ``Q`` with ``Q 1 = 1`` (see the module docstring); square only."""

    rectangular = False
    #: largest ``|Q 1 - 1|`` entry (relative to 1) :meth:`validate` accepts
    mean_atol: ClassVar[float] = 1e-4

    def _inside(self, rest: Tensor, n: int) -> Tensor:
        """``H diag(1, rest) H^T`` in float64."""
        h = mean_basis(n).to(rest.device)
        inner = torch.eye(n, dtype=torch.float64, device=rest.device)
        inner[1:, 1:] = rest.double()
        return h @ inner @ h

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        check_square(m, n, self)
        rest = Orthogonal.random(self, n - 1, generator) if n > 1 else torch.zeros(0, 0)
        return self._inside(rest, n).float()

    def embedding(self, n: int, m: int) -> Tensor:
        check_square(m, n, self)
        return self.identity(n)

    def solve_subproblem(self, problem: Subproblem) -> Tensor:
        # <Q, C> = <diag(1, R), H^T C H>: Procrustes on the zero-mean block
        sim = problem.sim.detach().cpu().double()
        n = sim.shape[0]
        check_square(sim.shape[0], sim.shape[1], self)
        h = mean_basis(n)
        block = (h @ sim @ h)[1:, 1:]
        rest = Orthogonal.solve_subproblem(self, Subproblem(block, *problem[1:]))
        return self._inside(rest, n).float()

    def smooth_projection(self, dense: Tensor) -> Tensor:
        n = dense.shape[0]
        h = mean_basis(n).to(device=dense.device, dtype=dense.dtype)
        block = (h @ dense @ h)[1:, 1:]
        rest = Orthogonal.smooth_projection(self, block)
        inner = torch.eye(n, dtype=dense.dtype, device=dense.device)
        inner = torch.block_diag(inner[:1, :1], rest)
        return h @ inner @ h

    def validate(self, element: object, n: int) -> None:
        Orthogonal.validate(self, element, n)
        mat = check_tensor(element, self, ndim=2, integer=False).double().cpu()
        if mat.shape[0] != n:
            raise ValueError(f"{self.name} element has shape {tuple(mat.shape)}, the space has {n}")
        drift = float((mat.sum(dim=1) - 1.0).abs().max()) if n else 0.0
        if not drift <= self.mean_atol:  # also catches NaN
            raise ValueError(
                f"{self.name} element moves the mean direction: max |Q 1 - 1| = {drift:.3g}"
            )
