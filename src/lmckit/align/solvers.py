"""Per-group solvers: the best group element for a similarity matrix.

Every aligner reduces one space to a similarity ``C`` of shape ``(m, n)`` between the
reference model's units (rows) and the other model's units (columns), e.g.
``C = sum_u A_u B_u^T`` over the space's uses, and asks for the element ``T`` that
maximises ``<T, C> = tr(T^T C)``. The group decides how.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from lmckit.symmetry import (
    Group,
    HeadPermutation,
    Invertible,
    Orthogonal,
    Permutation,
    SemiPermutation,
    SemiPermutationElement,
)

__all__ = ["objective", "solve"]


def _assignment(cost: np.ndarray) -> np.ndarray:
    """Column index per row maximising the total similarity (square ``cost``)."""
    rows, cols = linear_sum_assignment(cost, maximize=True)
    out = np.empty(cost.shape[0], dtype=np.int64)
    out[rows] = cols
    return out


def _block_assignment(sim: np.ndarray, blocks: int) -> np.ndarray:
    """Best permutation mapping contiguous blocks onto blocks (nested assignment)."""
    n = sim.shape[0]
    size = n // blocks
    inner = {}
    score = np.empty((blocks, blocks))
    for g in range(blocks):
        for h in range(blocks):
            sub = sim[g * size : (g + 1) * size, h * size : (h + 1) * size]
            cols = _assignment(sub)
            inner[g, h] = cols
            score[g, h] = sub[np.arange(size), cols].sum()
    outer = _assignment(score)
    return np.concatenate([outer[g] * size + inner[g, outer[g]] for g in range(blocks)])


def solve(group: Group, sim: Tensor, *, gram: Tensor | None = None) -> object:
    """The element of ``group`` maximising ``<T, sim>``.

    Args:
        group: the space's group.
        sim: ``(m, n)`` similarity between reference units (rows) and other units.
        gram: ``(n, n)`` Gram matrix of the other model's writers; needed only by
            :class:`Invertible`, solved as least squares ``T = sim gram^{-1}``.

    Returns:
        The element, on the CPU (assignment runs in SciPy), whatever ``sim``'s device.
    """
    # assignment needs NumPy; the small SVDs are as fast on the CPU
    sim = sim.detach().cpu()
    gram = None if gram is None else gram.detach().cpu()
    if isinstance(group, HeadPermutation):
        d = group.head_dim
        # head similarity: the within-head diagonal of each (head, head) block
        blocks = sim.double().reshape(group.heads, d, group.heads, d)
        head_sim = torch.diagonal(blocks, dim1=1, dim2=3).sum(-1)
        return torch.from_numpy(_assignment(head_sim.numpy()))
    if isinstance(group, Permutation | SemiPermutation):
        m, n = sim.shape
        if m != n:
            raise NotImplementedError(
                "rectangular semi-permutations are solved by lmckit.align.width, not here"
            )
        sim_np = sim.double().numpy()
        blocks = group.blocks if isinstance(group, Permutation) else 1
        perm = _assignment(sim_np) if blocks == 1 else _block_assignment(sim_np, blocks)
        perm_t = torch.from_numpy(perm)
        if isinstance(group, SemiPermutation):
            return SemiPermutationElement(perm_t, torch.ones(n), n)
        return perm_t
    if isinstance(group, Orthogonal):
        # orthogonal Procrustes: argmax_O tr(O^T C) = U V^T for C = U S V^T
        u, _, vh = torch.linalg.svd(sim.double(), full_matrices=False)
        return (u @ vh).float()
    if isinstance(group, Invertible):
        if gram is None:
            raise ValueError("the invertible solver needs the other model's Gram matrix")
        eye = torch.eye(gram.shape[0], dtype=torch.float64)
        ridge = 1e-6 * float(torch.trace(gram.double())) / gram.shape[0]
        return torch.linalg.solve((gram.double() + ridge * eye).T, sim.double().T).T.float()
    raise TypeError(f"no solver for group {type(group).__name__}")


def objective(group: Group, element: object, sim: Tensor) -> float:
    """``<T, sim>`` for an element of ``group``."""
    if isinstance(group, Permutation):
        idx = element.to(sim.device)
        return float(sim.double()[torch.arange(sim.shape[0]), idx].sum())
    return float((group.matrix(element).to(sim.device) * sim.double()).sum())
