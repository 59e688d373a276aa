"""Orthogonal maps, square or rectangular (orthonormal columns embed a narrow space)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from lmckit.groups._base import (
    MatrixGroup,
    Role,
    Subproblem,
    check_tensor,
    check_wide,
    contract_units,
)

__all__ = ["ONE_THREAD_ENTRIES", "Orthogonal"]

#: SVDs of at most this many entries run on one thread. Threaded LAPACK gains little at
#: these sizes and stalls when the machine has more busy threads than cores: a 768 x 768
#: float64 SVD took 22.4 s on 2 threads and 0.71 s on 1 (2-core machine, load average 12).
ONE_THREAD_ENTRIES = 2048 * 2048
#: Newton-Schulz steps of :meth:`Orthogonal.smooth_projection`: a singular value s grows
#: about 1.5x a step while small, then converges quadratically to 1.
NEWTON_SCHULZ_STEPS = 12


@contextmanager
def _one_thread_if(condition: bool) -> Iterator[None]:
    """Run the block on one intra-op thread when ``condition`` holds, then restore."""
    before = torch.get_num_threads()
    if not condition or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class Orthogonal(MatrixGroup):
    """Orthogonal maps ``O`` (``O^T O = I``); rectangular ``m x n`` (``m >= n``) embed.

    Readers are contracted with ``O`` too (``O^{-T} = O``; for a rectangular map the
    reader becomes ``R O^T``, which satisfies ``R O^T O = R``).
    """

    rectangular = True
    elementwise_ok = False
    self_dual = True
    natural_statistic = "covariance"
    #: largest ``|O^T O - I|`` entry :meth:`validate` accepts (float32 round-off of
    #: products of a few hundred-dimensional maps stays below 1e-5).
    atol: ClassVar[float] = 1e-4

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        m = check_wide(m, n, self)
        gauss = torch.randn(m, n, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gauss)
        # sign fix makes the draw Haar-distributed
        return (q * torch.sign(torch.diagonal(r))[None, :]).float()

    def embedding(self, n: int, m: int) -> Tensor:
        """``[I; 0]``: the narrow space as the first ``n`` wide coordinates."""
        check_wide(m, n, self)
        return torch.eye(m, n)

    def inverse(self, element: Tensor) -> Tensor:
        if element.shape[0] != element.shape[1]:
            raise ValueError("a rectangular orthogonal embedding has no inverse")
        return element.T.contiguous()

    def reader_matrix(self, element: Tensor) -> Tensor:
        return element.double()

    def act(self, x: Tensor, element: Tensor, role: Role) -> Tensor:
        # writers and readers are both contracted with O (self-dual); in x's dtype, with
        # no float64 round trip of the element
        if role == "elementwise":
            raise ValueError(f"{self.name} cannot act on elementwise parameters")
        return contract_units(element.to(device=x.device, dtype=x.dtype), x)

    def solve_subproblem(self, problem: Subproblem) -> Tensor:
        sim = problem.sim
        m, n = sim.shape
        check_wide(m, n, self)
        # orthogonal Procrustes: argmax_O tr(O^T C) = U V^T for C = U S V^T
        with _one_thread_if(m * n <= ONE_THREAD_ENTRIES):
            u, _, vh = torch.linalg.svd(sim.detach().cpu().double(), full_matrices=False)
        return (u @ vh).float()

    def smooth_projection(self, dense: Tensor) -> Tensor:
        """The polar factor ``U V^T`` of ``dense`` (its nearest orthogonal map) by
        Newton-Schulz iterations ``X <- X (3 I - X^T X) / 2``, differentiable in ``dense``.

        Not the SVD: its gradient divides by ``s_i^2 - s_j^2``, infinite at an orthogonal
        ``dense`` (every ``s_i = 1``), which is where learned matching starts. Scaled by
        the spectral norm first (so every singular value is in ``(0, 1]``, where the
        iteration converges); near an orthogonal map a few steps are exact to float32.
        """
        x = dense / torch.linalg.matrix_norm(dense.detach(), ord=2).clamp_min(1e-12)
        for _ in range(NEWTON_SCHULZ_STEPS):
            x = 1.5 * x - 0.5 * x @ (x.T @ x)
        return x

    def validate(self, element: object, n: int) -> None:
        mat = check_tensor(element, self, ndim=2, integer=False)
        m, cols = mat.shape
        if cols != n:
            raise ValueError(f"Orthogonal element acts on {cols} units, the space has {n}")
        if m < n:
            raise ValueError(f"Orthogonal element maps {n} units into only m={m}")
        gram = mat.double().T @ mat.double()
        deviation = float((gram - torch.eye(n, dtype=torch.float64, device=mat.device)).abs().max())
        if not deviation <= self.atol:  # also catches NaN
            raise ValueError(
                f"Orthogonal element is not orthogonal: max |O^T O - I| = {deviation:.3g} "
                f"(tolerance {self.atol:g})"
            )
