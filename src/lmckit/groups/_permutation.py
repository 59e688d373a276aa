"""Permutations of units (optionally block-structured, the symmetry of GroupNorm)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmckit.groups._assignment import assignment, block_assignment
from lmckit.groups._base import Group, Role, Subproblem, check_square, check_tensor

__all__ = ["IndexPermutation", "Permutation", "check_permutation", "sinkhorn"]


class IndexPermutation(Group[Tensor]):
    """Shared algebra of groups whose element is an index vector (units or heads):
    composition by indexing, inversion by sorting, ``P^{-T} = P``."""

    self_dual = True
    gathers = True

    def compose(self, second: Tensor, first: Tensor) -> Tensor:
        # (second @ first) h = second (first h): h''[i] = h'[second[i]] = h[first[second[i]]]
        return first[second]

    def inverse(self, element: Tensor) -> Tensor:
        return torch.argsort(element)

    def reader_matrix(self, element: Tensor) -> Tensor:
        return self.matrix(element)  # P^{-T} = P

    def close(self, first: Tensor, second: Tensor, *, atol: float = 1e-6) -> bool:
        return bool(torch.equal(first.cpu(), second.cpu()))

    def units(self, n: int) -> int | None:
        return int(self.identity(n).numel())

    def unit_index(self, element: Tensor) -> Tensor:
        return element

    def spread(self, sim: Tensor) -> Tensor:
        return sim


@dataclass(frozen=True)
class Permutation(IndexPermutation):
    """Permutations of ``n`` units; element ``perm`` (``(n,)`` long) with ``h'[i] = h[perm[i]]``.

    ``blocks > 1`` restricts to permutations that map each of ``blocks`` contiguous
    blocks of ``n / blocks`` units onto a block (the symmetry of GroupNorm).
    """

    blocks: int = 1

    def identity(self, n: int) -> Tensor:
        return torch.arange(n)

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        check_square(m, n, self)
        if n % self.blocks:
            raise ValueError(f"{n} units do not split into {self.blocks} blocks")
        size = n // self.blocks
        order = torch.randperm(self.blocks, generator=generator)
        inner = [torch.randperm(size, generator=generator) for _ in range(self.blocks)]
        return torch.cat([int(b) * size + inner[i] for i, b in enumerate(order)])

    def matrix(self, element: Tensor) -> Tensor:
        return torch.eye(element.numel(), dtype=torch.float64)[element.cpu()]

    def dims(self, element: Tensor) -> tuple[int, int]:
        return element.numel(), element.numel()

    def act(self, x: Tensor, element: Tensor, role: Role) -> Tensor:
        # writers, readers and per-unit parameters are all permuted alike
        return x.index_select(1, element.to(x.device))

    def solve_subproblem(self, problem: Subproblem) -> Tensor:
        check_square(problem.sim.shape[0], problem.sim.shape[1], self)
        if self.blocks == 1:
            return assignment(problem.sim)
        return block_assignment(problem.sim, self.blocks)

    def objective(self, element: Tensor, sim: Tensor) -> float:
        # gather the n matched entries first: no float64 copy of the whole matrix
        rows = torch.arange(sim.shape[0], device=sim.device)
        return float(sim[rows, element.to(sim.device)].double().sum())

    def soft_matrix(self, logits: Tensor, *, temperature: float, iters: int) -> Tensor | None:
        # a soft matrix over a block-structured space would mix units across blocks
        return sinkhorn(logits / temperature, iters) if self.blocks == 1 else None

    def validate(self, element: object, n: int) -> None:
        perm = check_permutation(element, n, self)
        if self.blocks > 1:
            if n % self.blocks:
                raise ValueError(f"{n} units do not split into {self.blocks} blocks")
            size = n // self.blocks
            sources = perm.reshape(self.blocks, size) // size
            if not bool((sources == sources[:, :1]).all()):
                raise ValueError(
                    f"{self.name} element splits a block of {size} units across blocks"
                )


def check_permutation(element: object, n: int, group: Group, *, what: str = "units") -> Tensor:
    """``element`` as a permutation of ``range(n)`` (O(n)), else a one-line error."""
    perm = check_tensor(element, group, ndim=1, integer=True)
    if perm.numel() != n:
        raise ValueError(f"{group.name} element permutes {perm.numel()} {what}, the space has {n}")
    if n and (int(perm.min()) < 0 or int(perm.max()) >= n):
        raise ValueError(f"{group.name} element has entries outside [0, {n})")
    if n and not bool((torch.bincount(perm.cpu(), minlength=n) == 1).all()):
        raise ValueError(f"{group.name} element is not a permutation: it repeats an index")
    return perm


def sinkhorn(logits: Tensor, iters: int) -> Tensor:
    """Doubly stochastic matrix from ``(n, n)`` logits by log-domain Sinkhorn.

    Alternately normalises rows and columns of ``exp(logits)`` ``iters`` times.
    """
    if logits.ndim != 2 or logits.shape[0] != logits.shape[1]:
        raise ValueError(f"sinkhorn needs square logits, got shape {tuple(logits.shape)}")
    log_p = logits
    for _ in range(iters):
        log_p = log_p - torch.logsumexp(log_p, dim=1, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=0, keepdim=True)
    return log_p.exp()
