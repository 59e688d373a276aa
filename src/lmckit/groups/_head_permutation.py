"""Permutations of attention heads: whole blocks of ``head_dim`` units move together."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmckit.groups._assignment import assignment
from lmckit.groups._base import Role, Subproblem, check_square
from lmckit.groups._permutation import IndexPermutation, check_permutation

__all__ = ["HeadPermutation"]


@dataclass(frozen=True)
class HeadPermutation(IndexPermutation):
    """Permutations of attention heads: ``heads`` blocks of ``head_dim`` units each.

    Element: a head permutation ``perm`` (``(heads,)`` long); the space has
    ``n = heads * head_dim`` units and unit ``d`` of head ``perm[h]`` goes to unit ``d``
    of head ``h``.
    """

    heads: int
    head_dim: int

    def _expand(self, element: Tensor) -> Tensor:
        offsets = torch.arange(self.head_dim, device=element.device)
        return (element[:, None] * self.head_dim + offsets[None, :]).reshape(-1)

    def _check(self, n: int) -> None:
        if n != self.heads * self.head_dim:
            raise ValueError(f"space of {n} units is not {self.heads} heads x {self.head_dim}")

    def identity(self, n: int) -> Tensor:
        self._check(n)
        return torch.arange(self.heads)

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        check_square(m, n, self)
        self._check(n)
        return torch.randperm(self.heads, generator=generator)

    def matrix(self, element: Tensor) -> Tensor:
        n = self.heads * self.head_dim
        return torch.eye(n, dtype=torch.float64)[self._expand(element.cpu())]

    def dims(self, element: Tensor) -> tuple[int, int]:
        n = self.heads * self.head_dim
        return n, n

    def act(self, x: Tensor, element: Tensor, role: Role) -> Tensor:
        return x.index_select(1, self._expand(element.to(x.device)))

    def solve_subproblem(self, problem: Subproblem) -> Tensor:
        sim = problem.sim
        check_square(sim.shape[0], sim.shape[1], self)
        self._check(sim.shape[0])
        d = self.head_dim
        # head similarity: the within-head diagonal of each (head, head) block
        blocks = sim.detach().reshape(self.heads, d, self.heads, d)
        return assignment(torch.diagonal(blocks, dim1=1, dim2=3).double().sum(-1))

    def objective(self, element: Tensor, sim: Tensor) -> float:
        rows = torch.arange(sim.shape[0], device=sim.device)
        return float(sim[rows, self._expand(element.to(sim.device))].double().sum())

    def spread(self, sim: Tensor) -> Tensor:
        # the solver sums each (head, head) block's diagonal, recovering ``sim``
        eye = torch.eye(self.head_dim, dtype=sim.dtype, device=sim.device)
        return torch.kron(sim / self.head_dim, eye)

    def validate(self, element: object, n: int) -> None:
        self._check(n)
        check_permutation(element, self.heads, self, what="heads")
