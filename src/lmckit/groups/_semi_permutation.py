"""Semi-permutations: split units of a positively homogeneous layer into wider layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lmckit.groups._assignment import injective
from lmckit.groups._base import Group, Role, Subproblem, check_tensor, check_wide

__all__ = ["Coefficients", "SemiPermutation", "SemiPermutationElement"]

Coefficients = Literal["uniform", "similarity"]


@dataclass(frozen=True)
class SemiPermutationElement:
    """Sparse ``m x n`` column-stochastic matrix with one nonzero per row.

    Row ``i`` has the value ``coef[i] > 0`` in column ``assign[i]``; the coefficients
    of the rows assigned to one column sum to 1. Unit ``j`` of the narrow space is
    split over the wide units ``{i : assign[i] = j}``.
    """

    assign: Tensor  # (m,) long
    coef: Tensor  # (m,) float, positive
    n: int

    def matrix(self) -> Tensor:
        m = self.assign.numel()
        mat = torch.zeros(m, self.n, dtype=torch.float64)
        mat[torch.arange(m), self.assign.cpu()] = self.coef.double().cpu()
        return mat


def _normalised(assign: Tensor, raw: Tensor, n: int) -> SemiPermutationElement:
    """Coefficients ``raw`` rescaled so each narrow unit's copies sum to 1."""
    totals = torch.zeros(n, dtype=torch.float64).index_add_(0, assign, raw.double())
    return SemiPermutationElement(assign, (raw.double() / totals[assign]).float(), n)


@dataclass(frozen=True)
class SemiPermutation(Group[SemiPermutationElement]):
    """Semi-permutations: split units of a positively homogeneous layer (ReLU).

    A writer row of unit ``j`` is scaled by ``coef[i]`` into each wide unit ``i``;
    readers copy unit ``j``'s column into every such ``i`` (the left inverse ``L``
    with ``L[j, i] = 1`` for ``assign[i] = j``). Valid only where
    ``relu(c x) = c relu(x)`` holds, i.e. for ReLU-like activations.

    Attributes:
        coefficients: how :meth:`solve` splits a unit over its copies: ``uniform``
            (``1 / k`` for ``k`` copies) or ``similarity`` (proportional to each
            copy's cosine similarity with the unit, clipped at 0.05).
    """

    coefficients: Coefficients = "uniform"

    rectangular = True
    elementwise_ok = False
    # the split is a heuristic, not the maximiser of <T, C>
    exact = False
    needs_norms = True

    def __post_init__(self) -> None:
        if self.coefficients not in ("uniform", "similarity"):
            raise ValueError(
                f"coefficients must be 'uniform' or 'similarity', got {self.coefficients!r}"
            )

    def identity(self, n: int) -> SemiPermutationElement:
        return SemiPermutationElement(torch.arange(n), torch.ones(n), n)

    def random(
        self, n: int, generator: torch.Generator, *, m: int | None = None
    ) -> SemiPermutationElement:
        m = check_wide(m, n, self)
        # every narrow unit gets at least one wide unit, the rest are spread at random
        extra = torch.randint(0, n, (m - n,), generator=generator)
        assign = torch.cat([torch.arange(n), extra])[torch.randperm(m, generator=generator)]
        raw = torch.rand(m, generator=generator, dtype=torch.float64) + 0.5
        return _normalised(assign, raw, n)

    def embedding(self, n: int, m: int) -> SemiPermutationElement:
        """Wide unit ``i`` copies narrow unit ``i mod n``, coefficients uniform."""
        check_wide(m, n, self)
        return _normalised(torch.arange(m) % n, torch.ones(m, dtype=torch.float64), n)

    def compose(
        self, second: SemiPermutationElement, first: SemiPermutationElement
    ) -> SemiPermutationElement:
        assign = first.assign[second.assign]
        coef = second.coef * first.coef[second.assign]
        return SemiPermutationElement(assign, coef, first.n)

    def inverse(self, element: SemiPermutationElement) -> SemiPermutationElement:
        m = element.assign.numel()
        if m != element.n or not torch.equal(torch.sort(element.assign).values, torch.arange(m)):
            raise ValueError("only square semi-permutations (permutations) are invertible")
        # a square semi-permutation with column sums 1 is a permutation matrix
        return SemiPermutationElement(torch.argsort(element.assign), torch.ones(m), m)

    def matrix(self, element: SemiPermutationElement) -> Tensor:
        return element.matrix()

    def reader_matrix(self, element: SemiPermutationElement) -> Tensor:
        return (element.matrix() > 0).double()

    def dims(self, element: SemiPermutationElement) -> tuple[int, int]:
        return element.assign.numel(), element.n

    def act(self, x: Tensor, element: SemiPermutationElement, role: Role) -> Tensor:
        if role == "elementwise":
            # splitting a unit rescales it: a norm's per-unit parameters cannot follow
            raise ValueError("SemiPermutation cannot act on elementwise parameters")
        picked = x.index_select(1, element.assign.to(x.device))
        if role == "read":
            return picked
        return picked * element.coef.to(x)[None, :, None]

    def close(
        self, first: SemiPermutationElement, second: SemiPermutationElement, *, atol: float = 1e-6
    ) -> bool:
        return (
            first.n == second.n
            and torch.equal(first.assign.cpu(), second.assign.cpu())
            and bool(torch.allclose(first.coef.cpu(), second.coef.cpu(), rtol=0, atol=atol))
        )

    def solve_subproblem(self, problem: Subproblem) -> SemiPermutationElement:
        """Each narrow unit gets the wide unit of a rectangular assignment on the
        similarity; every leftover wide unit copies the narrow unit it resembles most
        (cosine, from the problem's norms; raw similarity without them); coefficients by
        :attr:`coefficients`."""
        m, n = problem.sim.shape
        check_wide(m, n, self)
        sim = problem.sim.detach().cpu().double()
        cosine = sim
        if problem.norms is not None:
            ref, other = (v.detach().cpu().double() for v in problem.norms)
            cosine = sim / (ref[:, None] * other[None, :] + 1e-12)
        slots = injective(sim)
        assign = cosine.argmax(dim=1)
        assign[slots] = torch.arange(n)
        if self.coefficients == "uniform":
            raw = torch.ones(m, dtype=torch.float64)
        else:
            raw = cosine[torch.arange(m), assign].clamp_min(0.05)
        return _normalised(assign, raw, n)

    def objective(self, element: SemiPermutationElement, sim: Tensor) -> float:
        rows = torch.arange(sim.shape[0], device=sim.device)
        picked = sim[rows, element.assign.to(sim.device)].double()
        return float((picked * element.coef.to(sim.device).double()).sum())

    def validate(self, element: object, n: int) -> None:
        if not isinstance(element, SemiPermutationElement):
            raise ValueError(
                f"SemiPermutation element must be a SemiPermutationElement, got "
                f"{type(element).__name__}"
            )
        assign = check_tensor(element.assign, self, ndim=1, integer=True)
        coef = check_tensor(element.coef, self, ndim=1, integer=False)
        m = assign.numel()
        if element.n != n:
            raise ValueError(f"SemiPermutation element embeds {element.n} units, the space has {n}")
        if coef.numel() != m or m < n:
            raise ValueError(
                f"SemiPermutation element needs m >= n={n} assignments and as many "
                f"coefficients, got {m} and {coef.numel()}"
            )
        if m and (int(assign.min()) < 0 or int(assign.max()) >= n):
            raise ValueError(f"SemiPermutation element assigns units outside [0, {n})")
        if not bool((coef > 0).all()) or not bool(torch.isfinite(coef).all()):
            raise ValueError("SemiPermutation coefficients must be positive and finite")
        sums = torch.zeros(n, dtype=torch.float64).index_add_(0, assign.cpu(), coef.cpu().double())
        worst = int((sums - 1).abs().argmax()) if n else 0
        if n and abs(float(sums[worst]) - 1) > 1e-4:
            raise ValueError(
                f"SemiPermutation coefficients of each unit must sum to 1; unit {worst} "
                f"sums to {float(sums[worst]):.6g}"
            )
