"""A positive scale per unit: the symmetry of a branch whose units only ever multiply.

In a gated MLP, ``down (act(gate x) * (up x))``, each unit of the ``up`` branch may be
scaled by any ``s > 0`` if the ``down`` column reading it is divided by ``s`` (any
``s != 0`` would do; the positive scalings are the part that moves a unit continuously,
and the part whose fit below is always well posed). Writers move by ``diag(s)``,
readers by ``diag(1 / s)``.

Element: the ``(n,)`` positive vector ``s``. Weight matching fits each unit's scale by
least squares on both sides, ``min_s |A_w - s B_w|^2 + |A_r - B_r / s|^2``: the writers
alone would shrink a unit that matches badly to nothing and blow its reader up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmckit.groups._base import Group, Role, Subproblem, check_square, check_tensor

__all__ = ["Scaling"]

#: smallest scale learned matching may reach (a unit scaled to zero cannot be undone)
MIN_LEARNED_SCALE = 1e-3


def _fit(alpha: Tensor, beta: Tensor, gamma: Tensor, delta: Tensor) -> Tensor:
    """Per unit, ``argmin_{s > 0} alpha s^2 - 2 beta s + gamma / s^2 - 2 delta / s``.

    With ``alpha, gamma > 0`` the minimum lies inside ``(0, inf)`` where the derivative
    vanishes: ``alpha s^4 - beta s^3 + delta s - gamma = 0``. Its real positive roots
    (eigenvalues of the companion matrix) are compared by the cost; a unit with no
    writer or no reader keeps the one-sided fit (or 1).
    """
    n = alpha.numel()
    out = torch.ones(n, dtype=torch.float64)
    both = (alpha > 1e-12) & (gamma > 1e-12)
    if bool(both.any()):
        a, b, g, d = alpha[both], beta[both], gamma[both], delta[both]
        companion = torch.zeros(int(both.sum()), 4, 4, dtype=torch.float64)
        companion[:, 1:, :3] = torch.eye(3, dtype=torch.float64)
        # s^4 - (b/a) s^3 + 0 s^2 + (d/a) s - g/a: last column holds -c_0 .. -c_3
        companion[:, 0, 3] = g / a
        companion[:, 1, 3] = -d / a
        companion[:, 2, 3] = 0.0
        companion[:, 3, 3] = b / a
        roots = torch.linalg.eigvals(companion)
        real = roots.real
        usable = (roots.imag.abs() <= 1e-6 * roots.abs().clamp_min(1e-12)) & (real > 0)
        s = real.clamp_min(1e-12)
        cost = a[:, None] * s**2 - 2 * b[:, None] * s + g[:, None] / s**2 - 2 * d[:, None] / s
        cost = torch.where(usable, cost, torch.full_like(cost, float("inf")))
        best = cost.argmin(1)
        chosen = s.gather(1, best[:, None]).squeeze(1)
        out[both] = torch.where(torch.isfinite(cost.min(1).values), chosen, 1.0)
    writers = (alpha > 1e-12) & ~both & (beta > 0)
    out[writers] = beta[writers] / alpha[writers]
    readers = (gamma > 1e-12) & ~both & (delta > 0)
    out[readers] = gamma[readers] / delta[readers]
    return out


def _diagonal(matrix: Tensor) -> Tensor:
    """The diagonal of a square matrix, or the ``(n,)`` diagonal itself
    (:attr:`~lmckit.groups.Group.unitwise`), in float64 on the CPU."""
    diagonal = matrix if matrix.ndim == 1 else torch.diagonal(matrix)
    return diagonal.double().cpu()


@dataclass(frozen=True)
class Scaling(Group[Tensor]):
    """Positive scales of each of ``n`` units (a scaling of each unit)."""

    elementwise_ok = False
    exact = False
    least_squares = True
    fits_readers = True
    learned_by_inverse = True
    unitwise = True

    def identity(self, n: int) -> Tensor:
        return torch.ones(n)

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        check_square(m, n, self)
        return torch.exp(0.5 * torch.randn(n, generator=generator, dtype=torch.float64)).float()

    def compose(self, second: Tensor, first: Tensor) -> Tensor:
        return second * first

    def inverse(self, element: Tensor) -> Tensor:
        return 1.0 / element

    def matrix(self, element: Tensor) -> Tensor:
        return torch.diag(element.double())

    def reader_matrix(self, element: Tensor) -> Tensor:
        return torch.diag(1.0 / element.double())

    def dims(self, element: Tensor) -> tuple[int, int]:
        return element.numel(), element.numel()

    def act(self, x: Tensor, element: Tensor, role: Role) -> Tensor:
        if role == "elementwise":
            raise ValueError(f"{self.name} cannot act on elementwise parameters")
        scale = element.to(device=x.device, dtype=x.dtype)
        scale = scale if role == "write" else 1.0 / scale
        return x * scale[None, :, None]

    def unit_factors(self, element: Tensor, role: Role) -> Tensor | None:
        if role == "elementwise":
            raise ValueError(f"{self.name} cannot act on elementwise parameters")
        return element if role == "write" else 1.0 / element

    def reindex(self, element: Tensor, index: Tensor) -> Tensor:
        return element[index.to(element.device)]

    def solve_subproblem(self, problem: Subproblem) -> Tensor:
        beta = _diagonal(problem.sim)
        if problem.gram is None:  # a dense matrix's nearest element: its positive diagonal
            return torch.where(beta > 1e-12, beta, 1.0).float()
        alpha = _diagonal(problem.gram)
        if problem.readers is None:
            zero = torch.zeros_like(alpha)
            return _fit(alpha, beta, zero, zero).float()
        delta = _diagonal(problem.readers[0])
        gamma = _diagonal(problem.readers[1])
        return _fit(alpha, beta, gamma, delta).float()

    def project(self, dense: Tensor) -> Tensor:
        """The scales on ``dense``'s diagonal, at least :data:`MIN_LEARNED_SCALE`."""
        return torch.diagonal(dense.detach()).float().cpu().clamp_min(MIN_LEARNED_SCALE)

    def smooth_projection(self, dense: Tensor) -> Tensor:
        """The matrix of :meth:`project`, differentiable in ``dense``."""
        return torch.diag(torch.diagonal(dense).clamp_min(MIN_LEARNED_SCALE))

    def dense_reader(self, mat: Tensor) -> Tensor:
        return torch.diag(1.0 / torch.diagonal(mat))  # no n x n inverse for a diagonal

    def objective(self, element: Tensor, sim: Tensor) -> float:
        return float((element.double().cpu() * _diagonal(sim)).sum())

    def close(self, first: Tensor, second: Tensor, *, atol: float = 1e-6) -> bool:
        # the scales themselves: no n x n matrices
        return first.shape == second.shape and bool(torch.allclose(first, second, atol=atol))

    def validate(self, element: object, n: int) -> None:
        scale = check_tensor(element, self, ndim=1, integer=False)
        if scale.numel() != n:
            raise ValueError(f"{self.name} element scales {scale.numel()} units, the space has {n}")
        if not bool(torch.isfinite(scale).all()) or bool((scale <= 0).any()):
            raise ValueError(f"{self.name} element must be finite and positive")
