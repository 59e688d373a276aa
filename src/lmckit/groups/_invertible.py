"""General invertible maps: the symmetry of a linear (activation-free) hidden space."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from lmckit.groups._base import MatrixGroup, Subproblem, check_square, check_tensor
from lmckit.groups._orthogonal import Orthogonal

__all__ = ["Invertible"]


@dataclass(frozen=True)
class Invertible(MatrixGroup):
    """General invertible maps ``A`` (``n x n``); readers get ``A^{-T}``.

    The reader map makes the weight-matching objective nonlinear in ``A``, so
    :meth:`solve` fits the writers by least squares instead:
    ``argmin_A ||A_ref - A B||^2 = C G^{-1}`` with ``C = A_ref B^T`` over writers and
    ``G = B B^T``.
    """

    elementwise_ok = False
    exact = False
    least_squares = True
    learned_by_inverse = True
    natural_statistic = "covariance"
    #: :meth:`validate` refuses condition numbers above this (float32 cannot invert
    #: such a map reliably).
    max_condition: ClassVar[float] = 1e7

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        check_square(m, n, self)
        # well conditioned: orthogonal times a diagonal with entries in [0.5, 2]
        q = Orthogonal().random(n, generator).double()
        scale = 0.5 + 1.5 * torch.rand(n, generator=generator, dtype=torch.float64)
        return (q * scale[None, :]).float()

    def inverse(self, element: Tensor) -> Tensor:
        return torch.linalg.inv(element.double()).to(element.dtype)

    def reader_matrix(self, element: Tensor) -> Tensor:
        return torch.linalg.inv(element.double()).T

    def solve_subproblem(self, problem: Subproblem) -> Tensor:
        if problem.gram is None:
            raise ValueError("the invertible solver needs the other model's Gram matrix")
        check_square(problem.sim.shape[0], problem.sim.shape[1], self)
        sim, gram = problem.sim.detach().cpu().double(), problem.gram.detach().cpu().double()
        eye = torch.eye(gram.shape[0], dtype=torch.float64)
        # a tiny ridge keeps rank-deficient writers (fewer rows than units) solvable
        ridge = 1e-6 * float(torch.trace(gram)) / gram.shape[0]
        return torch.linalg.solve((gram + ridge * eye).T, sim.T).T.float()

    def project(self, dense: Tensor) -> Tensor:
        return dense.detach().float().cpu()

    def smooth_projection(self, dense: Tensor) -> Tensor:
        return dense

    def validate(self, element: object, n: int) -> None:
        mat = check_tensor(element, self, ndim=2, integer=False)
        if tuple(mat.shape) != (n, n):
            raise ValueError(
                f"Invertible element has shape {tuple(mat.shape)}, the space needs ({n}, {n})"
            )
        condition = float(torch.linalg.cond(mat.double()))
        if not condition <= self.max_condition:  # also catches NaN and inf
            raise ValueError(
                f"Invertible element is singular or ill-conditioned "
                f"(condition number {condition:.3g} > {self.max_condition:g})"
            )
