"""Rotations of rotary frequency planes: the symmetry of a query/key basis under RoPE.

Rotary position embeddings rotate each plane ``p`` of a query or key head by the angle
``theta_p * position``. A map applied to the keys of a head, and (as its inverse
transpose) to the queries that read them, keeps every score only if it commutes with
all those rotations: a rotation within each plane (2 x 2 rotations commute; a
reflection turns the angle around), and any orthogonal map of the dimensions that pass
through unrotated (partial rotary embeddings). Which dimensions pair into a plane is the
layout: ``(i, i + r / 2)`` when the second half of the rotary dimensions is rotated
against the first ("rotate half", Llama, Mistral, Qwen2, GPT-NeoX), ``(2 i, 2 i + 1)``
when neighbours pair ("interleaved", GPT-J).

Element: the dense ``(n, n)`` orthogonal matrix, block structured as above.
"""

from __future__ import annotations

import math
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

__all__ = ["RotaryPlanes", "plane_pairs"]


def plane_pairs(rotary: int, *, interleaved: bool) -> Tensor:
    """``(rotary / 2, 2)``: the two dimensions of each rotary plane, ``(i, i + rotary / 2)``
    (rotate-half) or ``(2i, 2i + 1)`` (interleaved)."""
    half = rotary // 2
    first = torch.arange(half)
    if interleaved:
        return torch.stack([2 * first, 2 * first + 1], dim=1)
    return torch.stack([first, first + half], dim=1)


@dataclass(frozen=True)
class RotaryPlanes(MatrixGroup):
    """Rotations of each rotary plane, times orthogonal maps of the unrotated dimensions.

    Attributes:
        rotary: how many leading dimensions are rotary (even); the rest pass through.
        interleaved: planes pair neighbouring dimensions instead of the two halves.
    """

    rotary: int
    interleaved: bool = False

    elementwise_ok = False
    self_dual = True
    natural_statistic = "covariance"
    #: largest deviation from the structure :meth:`validate` accepts
    atol: ClassVar[float] = 1e-4

    def __post_init__(self) -> None:
        if self.rotary < 2 or self.rotary % 2:
            raise ValueError(f"RotaryPlanes needs an even number of rotary dims, got {self.rotary}")

    @cached_property
    def _pairs(self) -> Tensor:
        """``(rotary / 2, 2)``: the two dimensions of each plane."""
        return plane_pairs(self.rotary, interleaved=self.interleaved)

    def _check(self, n: int) -> None:
        if n < self.rotary:
            raise ValueError(f"{self.name}: {self.rotary} rotary dims in a space of {n}")

    def _assemble(self, n: int, angles: Tensor, rest: Tensor) -> Tensor:
        out = torch.zeros(n, n, dtype=torch.float64)
        i, j = self._pairs[:, 0], self._pairs[:, 1]
        c, s = torch.cos(angles.double()), torch.sin(angles.double())
        out[i, i], out[j, j], out[i, j], out[j, i] = c, c, -s, s
        out[self.rotary :, self.rotary :] = rest.double()
        return out.float()

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        check_square(m, n, self)
        self._check(n)
        angles = torch.rand(self.rotary // 2, generator=generator, dtype=torch.float64)
        k = n - self.rotary
        gauss = torch.randn(k, k, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gauss) if k else (gauss, gauss)
        rest = q * torch.sign(torch.diagonal(r))[None, :] if k else q
        return self._assemble(n, 2 * math.pi * angles, rest)

    def inverse(self, element: Tensor) -> Tensor:
        return element.T.contiguous()

    def reader_matrix(self, element: Tensor) -> Tensor:
        return element.double()  # orthogonal: R^{-T} = R

    def act(self, x: Tensor, element: Tensor, role: Role) -> Tensor:
        if role == "elementwise":
            raise ValueError(f"{self.name} cannot act on elementwise parameters")
        return contract_units(element.to(device=x.device, dtype=x.dtype), x)

    def solve_subproblem(self, problem: Subproblem) -> Tensor:
        sim = problem.sim.detach().cpu().double()
        n = sim.shape[0]
        check_square(sim.shape[0], sim.shape[1], self)
        self._check(n)
        i, j = self._pairs[:, 0], self._pairs[:, 1]
        # <R(a), C> = cos a (C_ii + C_jj) + sin a (C_ji - C_ij): maximal at this angle
        angles = torch.atan2(sim[j, i] - sim[i, j], sim[i, i] + sim[j, j])
        rest = sim[self.rotary :, self.rotary :]
        if rest.numel():
            u, _, vh = torch.linalg.svd(rest)
            rest = u @ vh
        return self._assemble(n, angles, rest)

    def validate(self, element: object, n: int) -> None:
        mat = check_tensor(element, self, ndim=2, integer=False).double().cpu()
        if tuple(mat.shape) != (n, n):
            raise ValueError(f"{self.name} element has shape {tuple(mat.shape)}, the space has {n}")
        self._check(n)
        i, j = self._pairs[:, 0], self._pairs[:, 1]
        c, s = mat[i, i], mat[j, i]
        rebuilt = self._assemble(n, torch.atan2(s, c), mat[self.rotary :, self.rotary :]).double()
        deviation = float((rebuilt - mat).abs().max()) if n else 0.0
        gram = mat.T @ mat
        deviation = max(deviation, float((gram - torch.eye(n, dtype=torch.float64)).abs().max()))
        if not deviation <= self.atol:  # also catches NaN
            raise ValueError(
                f"{self.name} element is not a rotation of each rotary plane times an "
                f"orthogonal map of the rest (deviation {deviation:.3g})"
            )
