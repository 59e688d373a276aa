"""Why wide networks merge without permutations: LEWC and its two sufficient conditions.

From "Do We Really Need Permutations? Impact of Width Expansion on Linear Mode
Connectivity" (arXiv 2510.08023). For the merge ``theta_c = lam theta_a + (1 - lam) theta_b``
of two networks with layer outputs ``f_l`` (``l = 1`` is the first hidden layer):

- LEWC (layerwise exponentially weighted connectivity):
  ``f_l(theta_c) ~ lam^l f_l(theta_a) + (1 - lam)^l f_l(theta_b)``.
  Layer 1 is exact before the nonlinearity; each further layer multiplies by
  ``W_c = lam W_a + (1 - lam) W_b`` and the cross terms ``W_a z_b``, ``W_b z_a`` vanish
  under reciprocal orthogonality, while the ReLU passes sums through under weak
  additivity.
- Weak additivity of ReLU: ``sigma(u + v) ~ sigma(u) + sigma(v)``.
- Reciprocal orthogonality: ``E||W_a z_b|| / E||W_a z_a|| ~ 0`` where ``z`` is the input
  of layer ``W`` in each model: one model's features lie in the other's null space.
- Effective rank (Roy & Vetterli 2007) ``exp(-sum_i p_i log p_i)``, ``p_i = s_i / sum_j s_j``
  over singular values ``s``: strong weight decay makes it small, which enables the above.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.diagnostics._features import module_features
from lmckit.symmetry._params import Params, check_compatible

__all__ = [
    "effective_rank",
    "lewc_cosine",
    "mean_cosine",
    "reciprocal_orthogonality",
    "reciprocal_orthogonality_per_layer",
    "weak_additivity",
    "weak_additivity_per_layer",
]


def _rows(x: Tensor) -> Tensor:
    # one row per example: (batch, ...) -> (batch, features)
    return x.reshape(x.shape[0], -1).double()


def mean_cosine(x: Tensor, y: Tensor, *, eps: float = 1e-12) -> float:
    """Mean over examples of ``cos(x_i, y_i)``; ``x, y`` are ``(batch, ...)``.

    An example where either vector is zero counts as cosine 1 if both are zero, else 0.
    """
    if x.shape != y.shape or x.ndim < 1 or x.shape[0] == 0:
        raise ValueError(f"need two non-empty batches of one shape, got {x.shape} and {y.shape}")
    a, b = _rows(x), _rows(y)
    na, nb = a.norm(dim=1), b.norm(dim=1)
    cos = (a * b).sum(1) / (na * nb).clamp_min(eps)
    both_zero = (na <= eps) & (nb <= eps)
    cos = torch.where(both_zero, torch.ones_like(cos), cos)
    return float(cos.mean())


def weak_additivity(u: Tensor, v: Tensor) -> float:
    """Mean cosine between ``relu(u + v)`` and ``relu(u) + relu(v)`` (1 = additive)."""
    return mean_cosine(F.relu(u + v), F.relu(u) + F.relu(v))


def reciprocal_orthogonality(weight: Tensor, z_own: Tensor, z_other: Tensor) -> float:
    """``E||W z_other|| / E||W z_own||`` for a weight ``(out, in)`` and inputs ``(batch, in)``.

    ``W`` belongs to one model, ``z_own`` are its own layer inputs and ``z_other`` the
    other model's inputs to the same layer on the same examples (no bias).
    """
    if weight.ndim != 2:
        raise ValueError(f"weight must be a matrix (out, in), got shape {tuple(weight.shape)}")
    za, zb = _rows(z_own), _rows(z_other)
    if za.shape[1] != weight.shape[1] or zb.shape[1] != weight.shape[1]:
        raise ValueError(
            f"inputs of width {za.shape[1]} / {zb.shape[1]} do not fit a weight of shape "
            f"{tuple(weight.shape)}"
        )
    w = weight.double()
    own = (za @ w.T).norm(dim=1).mean()
    if float(own) == 0.0:
        raise ValueError("the model's own inputs are in the null space of its weight")
    return float((zb @ w.T).norm(dim=1).mean() / own)


def effective_rank(weight: Tensor) -> float:
    """Roy-Vetterli effective rank ``exp(H(p))``, ``p = s / sum(s)`` of the singular values.

    Conv kernels ``(out, in, k...)`` are read as ``(out, in * prod(k))``. Between 1 (rank
    one) and ``min(out, in)`` (all singular values equal).
    """
    if weight.ndim < 2:
        raise ValueError(f"need a matrix or kernel, got shape {tuple(weight.shape)}")
    s = torch.linalg.svdvals(weight.reshape(weight.shape[0], -1).double())
    total = s.sum()
    if float(total) == 0.0:
        raise ValueError("effective rank of a zero matrix is undefined")
    p = s / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def _merge(a: Params, b: Params, lam: float) -> Params:
    check_compatible(a, b)
    return {
        k: lam * a[k] + (1 - lam) * b[k] if a[k].is_floating_point() else a[k].clone() for k in a
    }


def lewc_cosine(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    x: Tensor,
    sites: Sequence[str],
    *,
    lam: float = 0.5,
    merged: Params | None = None,
) -> dict[str, float]:
    """Per layer, mean cosine between the merged output and the LEWC prediction.

    ``cos(f_l(theta_c), lam^l f_l(theta_a) + (1 - lam)^l f_l(theta_b))`` where ``f_l`` is
    the output of ``sites[l - 1]`` (give sites in depth order) and
    ``theta_c = lam theta_a + (1 - lam) theta_b`` unless ``merged`` is given (e.g. after a
    BatchNorm reset).
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must lie in [0, 1], got {lam}")
    theta_c = _merge(params_a, params_b, lam) if merged is None else merged
    fa = module_features(model, params_a, x, sites)
    fb = module_features(model, params_b, x, sites)
    fc = module_features(model, theta_c, x, sites)
    out = {}
    for depth, site in enumerate(sites, start=1):
        predicted = lam**depth * fa[site] + (1 - lam) ** depth * fb[site]
        out[site] = mean_cosine(fc[site], predicted)
    return out


def weak_additivity_per_layer(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    x: Tensor,
    activations: Sequence[str],
) -> dict[str, float]:
    """Per ReLU module, ``weak_additivity(u_a, u_b)`` of the two models' pre-activations.

    ``u_a``, ``u_b`` are the inputs of each module in ``activations`` when A and B run
    on the same examples ``x``.
    """
    ua = module_features(model, params_a, x, activations, which="input")
    ub = module_features(model, params_b, x, activations, which="input")
    return {site: weak_additivity(ua[site], ub[site]) for site in activations}


def reciprocal_orthogonality_per_layer(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    x: Tensor,
    layers: Sequence[str],
) -> dict[str, float]:
    """Per Linear layer, the mean of both directions of :func:`reciprocal_orthogonality`.

    ``(E||W_a z_b|| / E||W_a z_a|| + E||W_b z_a|| / E||W_b z_b||) / 2`` with ``z`` the
    layer inputs of each model on ``x`` and ``W = params[layer + ".weight"]``.
    """
    za = module_features(model, params_a, x, layers, which="input")
    zb = module_features(model, params_b, x, layers, which="input")
    out = {}
    for layer in layers:
        key = f"{layer}.weight"
        if key not in params_a:
            raise ValueError(f"{key!r} is not a parameter of the model")
        ab = reciprocal_orthogonality(params_a[key], za[layer], zb[layer])
        ba = reciprocal_orthogonality(params_b[key], zb[layer], za[layer])
        out[layer] = 0.5 * (ab + ba)
    return out
