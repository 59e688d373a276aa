"""Padded permutations: embed ``n`` units into ``m`` slots, the other slots silent."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmckit.groups._assignment import injective
from lmckit.groups._base import Group, Role, Subproblem, check_tensor, check_wide

__all__ = ["PaddedPermutation", "PaddedPermutationElement"]


@dataclass(frozen=True)
class PaddedPermutationElement:
    """Injective ``m x n`` 0/1 matrix: narrow unit ``j`` goes to wide slot ``slots[j]``."""

    slots: Tensor  # (n,) long, distinct values in [0, m)
    m: int

    def matrix(self) -> Tensor:
        n = self.slots.numel()
        mat = torch.zeros(self.m, n, dtype=torch.float64)
        mat[self.slots.cpu(), torch.arange(n)] = 1.0
        return mat


@dataclass(frozen=True)
class PaddedPermutation(Group[PaddedPermutationElement]):
    """Zero-padding embeddings with a permutation: ``T = P[:, slots]`` (``m x n``).

    Writers are placed in the chosen wide slots, zero elsewhere; readers likewise
    (``T`` has orthonormal columns, so the left inverse is ``T^T`` and the reader
    matrix is ``T`` itself). Valid for any activation with ``act(0) = 0`` and any unit
    type whose extra units may be silent; not for elementwise parameters (norms).
    """

    rectangular = True
    elementwise_ok = False
    self_dual = True

    def identity(self, n: int) -> PaddedPermutationElement:
        return PaddedPermutationElement(torch.arange(n), n)

    def random(
        self, n: int, generator: torch.Generator, *, m: int | None = None
    ) -> PaddedPermutationElement:
        m = check_wide(m, n, self)
        return PaddedPermutationElement(torch.randperm(m, generator=generator)[:n], m)

    def embedding(self, n: int, m: int) -> PaddedPermutationElement:
        """The narrow units in the first ``n`` wide slots (``[I; 0]``)."""
        check_wide(m, n, self)
        return PaddedPermutationElement(torch.arange(n), m)

    def compose(
        self, second: PaddedPermutationElement, first: PaddedPermutationElement
    ) -> PaddedPermutationElement:
        return PaddedPermutationElement(second.slots[first.slots], second.m)

    def inverse(self, element: PaddedPermutationElement) -> PaddedPermutationElement:
        if element.m != element.slots.numel():
            raise ValueError("a rectangular padded permutation has no inverse")
        return PaddedPermutationElement(torch.argsort(element.slots), element.m)

    def matrix(self, element: PaddedPermutationElement) -> Tensor:
        return element.matrix()

    def reader_matrix(self, element: PaddedPermutationElement) -> Tensor:
        return element.matrix()

    def dims(self, element: PaddedPermutationElement) -> tuple[int, int]:
        return element.m, element.slots.numel()

    def act(self, x: Tensor, element: PaddedPermutationElement, role: Role) -> Tensor:
        if role == "elementwise":
            raise ValueError("PaddedPermutation cannot act on elementwise parameters")
        out = x.new_zeros(x.shape[0], element.m, x.shape[2])
        return out.index_copy(1, element.slots.to(x.device), x)

    def close(
        self,
        first: PaddedPermutationElement,
        second: PaddedPermutationElement,
        *,
        atol: float = 1e-6,
    ) -> bool:
        return first.m == second.m and torch.equal(first.slots.cpu(), second.slots.cpu())

    def solve_subproblem(self, problem: Subproblem) -> PaddedPermutationElement:
        m, n = problem.sim.shape
        check_wide(m, n, self)
        return PaddedPermutationElement(injective(problem.sim), m)

    def objective(self, element: PaddedPermutationElement, sim: Tensor) -> float:
        cols = torch.arange(sim.shape[1], device=sim.device)
        return float(sim[element.slots.to(sim.device), cols].double().sum())

    def validate(self, element: object, n: int) -> None:
        if not isinstance(element, PaddedPermutationElement):
            raise ValueError(
                "PaddedPermutation element must be a PaddedPermutationElement, got "
                f"{type(element).__name__}"
            )
        slots = check_tensor(element.slots, self, ndim=1, integer=True)
        m = element.m
        if slots.numel() != n:
            raise ValueError(
                f"PaddedPermutation element places {slots.numel()} units, the space has {n}"
            )
        if m < n:
            raise ValueError(f"PaddedPermutation element embeds {n} units into only m={m}")
        if n and (int(slots.min()) < 0 or int(slots.max()) >= m):
            raise ValueError(f"PaddedPermutation element has slots outside [0, {m})")
        if n and not bool((torch.bincount(slots.cpu(), minlength=m) <= 1).all()):
            raise ValueError("PaddedPermutation element puts two units in one slot")
