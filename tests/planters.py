"""Hand-written planters for attention heads: maps drawn without lmckit's spec.

Tests that plant symmetries by hand (query heads permuted, value bases and query/key
bases rotated) draw their maps here, and build rotary positions the way the models under
test apply them (``x cos + rotate_half(x) sin``, dims ``i`` and ``i + d / 2`` paired).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor


def orthogonal(n: int, gen: torch.Generator) -> Tensor:
    """A random ``n x n`` orthogonal matrix (float64)."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def plane_rotation(head_dim: int, gen: torch.Generator) -> Tensor:
    """A rotation of each rotary plane (dims ``i`` and ``i + head_dim / 2``; float64)."""
    out = torch.zeros(head_dim, head_dim, dtype=torch.float64)
    half = head_dim // 2
    for i in range(half):
        angle = 2 * math.pi * float(torch.rand((), generator=gen))
        c, s = math.cos(angle), math.sin(angle)
        out[i, i], out[i + half, i + half], out[i, i + half], out[i + half, i] = c, c, -s, s
    return out


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rotary_tables(head_dim: int, length: int) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of rotary positions, ``(length, head_dim)``."""
    freqs = 1.0 / 10.0 ** (torch.arange(head_dim // 2) / (head_dim // 2))
    angles = torch.arange(length)[:, None] * freqs[None, :]
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


def distance(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """Euclidean distance between two parameter sets (the keys of ``a``)."""
    return sum(float((a[k].double() - b[k].double()).norm() ** 2) for k in a) ** 0.5
