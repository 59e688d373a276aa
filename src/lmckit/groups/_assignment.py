"""Linear assignment: the discrete solvers behind every unit-moving group."""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

__all__ = ["assignment", "block_assignment", "injective"]


def assignment(sim: Tensor) -> Tensor:
    """Column index per row maximising the total similarity of a square ``sim``."""
    cost = sim.detach().cpu().double().numpy()
    rows, cols = linear_sum_assignment(cost, maximize=True)
    out = np.empty(cost.shape[0], dtype=np.int64)
    out[rows] = cols
    return torch.from_numpy(out)


def injective(sim: Tensor) -> Tensor:
    """Distinct row per column of an ``(m, n)`` ``sim`` (``m >= n``) maximising the
    total similarity: ``(n,)`` row indices."""
    cost = sim.detach().cpu().double().numpy()
    rows, cols = linear_sum_assignment(cost, maximize=True)
    out = np.empty(cost.shape[1], dtype=np.int64)
    out[cols] = rows
    return torch.from_numpy(out)


def block_assignment(sim: Tensor, blocks: int) -> Tensor:
    """Best permutation of a square ``sim`` mapping contiguous blocks onto blocks.

    Nested assignment: the best inner assignment for every pair of blocks, then the
    best assignment of blocks on those totals, which is exact for this subgroup.
    """
    n = sim.shape[0]
    size = n // blocks
    sim = sim.detach().cpu().double()
    inner: dict[tuple[int, int], Tensor] = {}
    score = torch.empty(blocks, blocks, dtype=torch.float64)
    for g in range(blocks):
        for h in range(blocks):
            sub = sim[g * size : (g + 1) * size, h * size : (h + 1) * size]
            cols = assignment(sub)
            inner[g, h] = cols
            score[g, h] = sub[torch.arange(size), cols].sum()
    outer = assignment(score).tolist()
    return torch.cat([outer[g] * size + inner[g, outer[g]] for g in range(blocks)])
