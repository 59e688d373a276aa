"""Linear assignment: the discrete solvers behind every unit-moving group.

Two backends give the same optimum. With the optional ``lapx`` package installed
(``pip install 'lmckit[fast]'``) its Jonker-Volgenant solver ``lap.lapjvr`` runs on the
float32 similarity as it is (float64 potentials inside); otherwise SciPy's
``linear_sum_assignment`` runs on a float64 copy. On weight matching's own cost matrices
(two 64 -> 2048 x3 -> 10 MLPs, every third matrix of a run) the JV solver took 3.8 s in
all where SciPy took 19.2 s: 3x faster on the first sweeps' matrices, 8-13x once
coordinate descent has settled, the same optimum on each
(``benchmarks/bench_assignment.py --width 2048 --every 3``). An answer that is not a
permutation (a solver bug) falls back to SciPy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

__all__ = ["assignment", "assignment_backend", "block_assignment", "injective"]


def _find_lapjvr() -> Callable[..., Any] | None:
    try:
        import lap  # the ``lapx`` distribution installs the ``lap`` module
    except ImportError:
        return None
    return getattr(lap, "lapjvr", None)  # absent from the older ``lap`` distribution


#: lapx's JV solver, or ``None`` to use SciPy (tests set it to ``None``).
_lapjvr = _find_lapjvr()


def assignment_backend() -> str:
    """``"lapx"`` or ``"scipy"``: which solver :func:`assignment` uses."""
    return "scipy" if _lapjvr is None else "lapx"


def _cost(sim: Tensor) -> np.ndarray:
    """``-sim`` (JV minimises; negation is exact) as a float32 or float64 CPU array,
    checked finite (a one-line error)."""
    sim = sim.detach()
    if sim.dtype not in (torch.float32, torch.float64):
        sim = sim.float()
    cost = np.negative(sim.cpu().numpy())  # a new array: the caller's tensor is kept
    if not np.isfinite(cost).all():  # numpy: no thread pool for an O(n^2) check
        raise ValueError("assignment: the similarity matrix has NaN or infinite entries")
    return cost


def _pairs(sim: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Matched ``(rows, cols)`` maximising the total of ``sim`` (``min(m, n)`` pairs)."""
    cost = _cost(sim)
    m, n = cost.shape
    if _lapjvr is not None and m and n:
        # a rectangular problem is solved natively, without padding
        rows, cols = _lapjvr(cost, extend_cost=m != n, return_cost=False)
        if len(rows) == min(m, n) and _distinct(rows, m) and _distinct(cols, n):
            return np.asarray(rows), np.asarray(cols)
    return linear_sum_assignment(cost.astype(np.float64), maximize=False)


def _distinct(index: np.ndarray, size: int) -> bool:
    index = np.asarray(index)
    if index.size == 0:
        return True
    if index.min() < 0 or index.max() >= size:
        return False
    return bool((np.bincount(index, minlength=size) <= 1).all())


def assignment(sim: Tensor) -> Tensor:
    """Column index per row maximising the total similarity of a square ``sim``."""
    rows, cols = _pairs(sim)
    out = np.empty(sim.shape[0], dtype=np.int64)
    out[rows] = cols
    return torch.from_numpy(out)


def injective(sim: Tensor) -> Tensor:
    """Distinct row per column of an ``(m, n)`` ``sim`` (``m >= n``) maximising the
    total similarity: ``(n,)`` row indices."""
    rows, cols = _pairs(sim)
    out = np.empty(sim.shape[1], dtype=np.int64)
    out[cols] = rows
    return torch.from_numpy(out)


def block_assignment(sim: Tensor, blocks: int) -> Tensor:
    """Best permutation of a square ``sim`` mapping contiguous blocks onto blocks.

    Nested assignment: the best inner assignment for every pair of blocks, then the
    best assignment of blocks on those totals, which is exact for this subgroup.
    """
    n = sim.shape[0]
    size = n // blocks
    sim = sim.detach().cpu()
    inner: dict[tuple[int, int], Tensor] = {}
    score = torch.empty(blocks, blocks, dtype=torch.float64)
    for g in range(blocks):
        for h in range(blocks):
            sub = sim[g * size : (g + 1) * size, h * size : (h + 1) * size]
            cols = assignment(sub)
            inner[g, h] = cols
            score[g, h] = sub[torch.arange(size), cols].double().sum()
    outer = assignment(score).tolist()
    return torch.cat([outer[g] * size + inner[g, outer[g]] for g in range(blocks)])
