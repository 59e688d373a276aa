"""Neuron identifiability diagnostics (Boehm et al., "Beyond structural symmetries").

A symmetry-broken layer has effective weights ``W_eff = M ⊙ W + C`` (see
:mod:`lmckit.experiments._identifiability._asymmetric`); neuron ``i`` has mask row
``m_i``, fixed row ``c_i`` and effective row ``w_i = m_i ⊙ v_i + c_i`` (``v_i``
trainable). On inputs in a
``k``-dim subspace with orthonormal basis ``U`` (``(d, k)``), neuron ``i``'s
preactivation is ``β_iᵀ z`` for ``x = U z`` with ``β_i = Uᵀ w_i``, and the functions it
can realise are ``β = Uᵀ diag(m_i) v + a_i`` with projected center ``a_i = Uᵀ c_i``
(Prop. 4.2). The minimum squared norm of ``v`` realising ``β`` (eq. 8, 10, Lemma C.2) is
the Mahalanobis form ``(β - a_i)ᵀ G_i⁺ (β - a_i)`` with Gram matrix
``G_i = Uᵀ diag(m_i)² U`` (``= Uᵀ diag(m_i) U`` for 0/1 masks), and ``+∞`` when
``β - a_i`` is outside the range of ``G_i``.

Everything here is a pure function on tensors; shapes are named in each docstring. The
functional diagnostics (activation-matching objectives, chord deviation) live in
:mod:`lmckit.diagnostics._neuron_function` and are re-exported here.
Biases are left out of the costs: they are trainable and unmasked, so swapping two
neurons' biases costs nothing.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lmckit.diagnostics._neuron_function import (
    MatchingObjective,
    activation_matching_objectives,
    chord_deviation,
    collect_layer_inputs,
    matching_objective,
    overall_objective,
)

__all__ = [
    "MatchingObjective",
    "activation_matching_objectives",
    "center_gaps",
    "chord_deviation",
    "coherence",
    "collect_layer_inputs",
    "gram_anisotropy",
    "gram_matrices",
    "input_subspace",
    "matching_objective",
    "min_center_gap",
    "overall_objective",
    "realization_cost",
    "realization_cost_matrix",
    "ridge_cost_matrix",
    "swap_costs",
]

# relative tolerance deciding that a target lies outside the range of a Gram matrix
_RANGE_TOL = 1e-6


def _check_rows(name: str, x: Tensor, d: int) -> None:
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"{name} must be (n, {d}), got {tuple(x.shape)}")


# --------------------------------------------------------------------------- subspace


def input_subspace(x: Tensor, *, explained: float = 0.9, center: bool = False) -> Tensor:
    """Orthonormal basis ``U`` (``(d, k)``) of the top principal subspace of ``x``.

    ``x``: ``(N, d)`` samples. The second moment ``Σ = xᵀx / N`` (covariance of the
    centred data if ``center``) has eigenvalues ``λ_1 >= ... >= λ_d``; ``k`` is the
    smallest number with ``Σ_{r<=k} λ_r >= explained · Σ_r λ_r`` (App. E.1, F.7). The
    default keeps the mean, matching the subspace model ``x = U z`` of Assumption 3.1.
    """
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"x must be (N, d) with N >= 1, got {tuple(x.shape)}")
    if not 0 < explained <= 1:
        raise ValueError(f"explained must be in (0, 1], got {explained}")
    x = x.double()
    if center:
        x = x - x.mean(0)
    sigma = x.T @ x / x.shape[0]
    evals, evecs = torch.linalg.eigh(sigma)
    evals, evecs = evals.flip(0).clamp_min(0), evecs.flip(1)
    total = float(evals.sum())
    if total <= 0:
        raise ValueError("x has no variance: the subspace is empty")
    cumulative = torch.cumsum(evals, 0) / total
    k = int((cumulative < explained - 1e-12).sum()) + 1
    return evecs[:, : min(k, x.shape[1])].float()


def coherence(basis: Tensor) -> float:
    """Subspace coherence ``μ(U) = max_d ||U[d, :]||²`` (eq. 11); ``k/d <= μ <= 1``.

    ``basis``: ``(d, k)`` with orthonormal columns (checked). ``μ`` depends on the
    subspace only (it is the largest diagonal entry of the projector ``U Uᵀ``).
    """
    if basis.ndim != 2 or basis.shape[1] < 1:
        raise ValueError(f"basis must be (d, k) with k >= 1, got {tuple(basis.shape)}")
    u = basis.double()
    eye = torch.eye(u.shape[1], dtype=u.dtype)
    if not torch.allclose(u.T @ u, eye, atol=1e-4):
        raise ValueError("basis columns must be orthonormal")
    return float((u * u).sum(1).max())


def gram_matrices(basis: Tensor, masks: Tensor) -> Tensor:
    """``G_i = Uᵀ diag(m_i)² U`` for every neuron: ``(n, k, k)`` (eq. 9).

    ``basis``: ``(d, k)``; ``masks``: ``(n, d)`` rows ``m_i`` of the multiplicative part.
    """
    _check_rows("masks", masks, basis.shape[0])
    u = basis.double()
    m2 = masks.double() ** 2
    return torch.einsum("dk,nd,dl->nkl", u, m2, u)


def gram_anisotropy(basis: Tensor, masks: Tensor) -> Tensor:
    """Condition number ``λ_max(G_i) / λ_min(G_i)`` per neuron: ``(n,)``.

    ``1`` is isotropic (near-Euclidean cost); ``inf`` means some direction of the input
    subspace is invisible to the neuron (``G_i`` singular). Thm. 4.4 bounds
    ``||G_i - p I||`` by the coherence, so incoherent subspaces give values near 1.
    """
    evals = torch.linalg.eigvalsh(gram_matrices(basis, masks))
    top = evals[:, -1]
    low = evals[:, 0]
    singular = low <= _RANGE_TOL * top.clamp_min(1e-300)
    ratio = top / low.clamp_min(1e-300)
    return torch.where(singular, torch.full_like(ratio, math.inf), ratio)


# --------------------------------------------------------------------------- realization costs


def _mahalanobis(gram: Tensor, diff: Tensor) -> Tensor:
    """``diffᵀ G⁺ diff`` per row of ``diff`` (``(m, k)``), ``inf`` outside range(G)."""
    pinv = torch.linalg.pinv(gram, hermitian=True, rtol=_RANGE_TOL)
    cost = ((diff @ pinv) * diff).sum(1)
    residual = diff - diff @ (pinv @ gram)  # component outside range(G)
    scale = diff.norm(dim=1).clamp_min(1e-12)
    outside = residual.norm(dim=1) > 1e-5 * scale
    return torch.where(outside, torch.full_like(cost, math.inf), cost)


def realization_cost(basis: Tensor, mask: Tensor, offset: Tensor, target: Tensor) -> float:
    """Realization cost of a preactivation ``target`` by a neuron with ``(mask, offset)``.

    ``R = min_v ||v||²`` s.t. ``Uᵀ(m ⊙ v + c) = Uᵀ w`` (eq. 8) ``= (β - a)ᵀ G⁺ (β - a)``
    with ``β = Uᵀ w``, ``a = Uᵀ c``, ``G = Uᵀ diag(m)² U`` (eq. 10); ``inf`` if
    ``β - a ∉ range(G)``. ``basis``: ``(d, k)``; ``mask``, ``offset``, ``target``:
    ``(d,)`` (``target`` is an effective weight row whose function is realised).
    """
    d = basis.shape[0]
    for name, v in (("mask", mask), ("offset", offset), ("target", target)):
        if v.shape != (d,):
            raise ValueError(f"{name} must be ({d},), got {tuple(v.shape)}")
    u = basis.double()
    diff = (u.T @ (target.double() - offset.double()))[None]
    gram = gram_matrices(basis, mask[None])[0]
    return float(_mahalanobis(gram, diff)[0])


def realization_cost_matrix(
    basis: Tensor, masks: Tensor, offsets: Tensor, weights: Tensor
) -> Tensor:
    """``D[i, j]``: cost of neuron ``j``'s function in neuron ``i``'s class; ``(n, n)``.

    ``D[i, j] = (β_j - a_i)ᵀ G_i⁺ (β_j - a_i)`` with ``β_j = Uᵀ w_j`` (effective weight
    rows), ``a_i = Uᵀ c_i``, ``G_i = Uᵀ diag(m_i)² U``; ``inf`` where ``β_j - a_i`` is
    outside ``range(G_i)``. ``basis``: ``(d, k)``; ``masks``, ``offsets``, ``weights``:
    ``(n, d)``.
    """
    d = basis.shape[0]
    for name, v in (("masks", masks), ("offsets", offsets), ("weights", weights)):
        _check_rows(name, v, d)
    if not masks.shape == offsets.shape == weights.shape:
        raise ValueError("masks, offsets and weights must have one shape (n, d)")
    u = basis.double()
    betas = weights.double() @ u  # (n, k)
    centers = offsets.double() @ u  # (n, k)
    grams = gram_matrices(basis, masks)
    rows = [_mahalanobis(grams[i], betas - centers[i]) for i in range(masks.shape[0])]
    return torch.stack(rows)


def ridge_cost_matrix(
    x: Tensor,
    masks: Tensor,
    offsets: Tensor,
    weights: Tensor,
    *,
    ridge: float,
    lipschitz: float = 1.0,
) -> Tensor:
    """Relaxed (ridge) realization costs ``D_λ[i, j]``; ``(n, n)``.

    Def. E.3 with the quadratic surrogate of Thm. E.4 (exact for a linear activation):
    ``D_λ[i, j] = min_v { L² E_x[((m_i ⊙ v + c_i - w_j)ᵀ x)²] + λ ||v||² } / λ``, with
    ``Σ = E[x xᵀ]`` from the samples ``x`` (``(N, d)``). The minimiser is
    ``v* = (L² D_i Σ D_i + λ I)⁻¹ L² D_i Σ (w_j - c_i)`` (``D_i = diag(m_i)``). For data
    on a subspace, ``D_λ → D`` of :func:`realization_cost_matrix` as ``λ → 0``
    (Thm. E.5); unlike the hard cost it stays finite and stable when some mass lies
    off the subspace. ``masks``, ``offsets``, ``weights``: ``(n, d)``.
    """
    if ridge <= 0 or lipschitz <= 0:
        raise ValueError(f"ridge and lipschitz must be > 0, got {ridge} and {lipschitz}")
    if x.ndim != 2:
        raise ValueError(f"x must be (N, d), got {tuple(x.shape)}")
    d = x.shape[1]
    for name, v in (("masks", masks), ("offsets", offsets), ("weights", weights)):
        _check_rows(name, v, d)
    xd = x.double()
    sigma = lipschitz**2 * (xd.T @ xd) / xd.shape[0]
    m = masks.double()  # (n, d)
    r = weights.double()[None, :, :] - offsets.double()[:, None, :]  # (i, j, d): w_j - c_i
    eye = torch.eye(d, dtype=torch.float64)
    systems = m[:, :, None] * sigma[None] * m[:, None, :] + ridge * eye  # (i, d, d)
    rhs = m[:, :, None] * torch.einsum("de,ije->idj", sigma, r)  # (i, d, j)
    v = torch.linalg.solve(systems, rhs)  # (i, d, j): minimisers v*_ij
    err = m[:, :, None] * v - r.transpose(1, 2)  # (i, d, j)
    fit = (torch.einsum("de,iej->idj", sigma, err) * err).sum(1)
    return (fit + ridge * (v * v).sum(1)) / ridge


def swap_costs(costs: Tensor) -> Tensor:
    """Swap-cost matrix ``Δ[i, j] = D[i, j] + D[j, i] - D[i, i] - D[j, j]``; ``(n, n)``.

    The change in total realization cost when neurons ``i`` and ``j`` exchange their
    functions (eq. 14 for a transposition). Zero on the diagonal; small or negative
    off-diagonal entries are cheap swaps (ineffective symmetry breaking).
    """
    if costs.ndim != 2 or costs.shape[0] != costs.shape[1]:
        raise ValueError(f"costs must be square (n, n), got {tuple(costs.shape)}")
    diag = costs.diagonal()
    delta = costs + costs.T - diag[:, None] - diag[None, :]
    return delta.fill_diagonal_(0.0)


def center_gaps(basis: Tensor, offsets: Tensor) -> Tensor:
    """Pairwise projected center distances ``||a_i - a_j||``, ``a_i = Uᵀ c_i``; ``(n, n)``."""
    _check_rows("offsets", offsets, basis.shape[0])
    centers = offsets.double() @ basis.double()
    return torch.cdist(centers, centers)


def min_center_gap(basis: Tensor, offsets: Tensor) -> float:
    """``δ = min_{i != j} ||a_i - a_j||`` (eq. 20): the cheapest swap's center gap."""
    gaps = center_gaps(basis, offsets)
    if gaps.shape[0] < 2:
        raise ValueError("need at least two neurons")
    return float(gaps.fill_diagonal_(math.inf).min())
