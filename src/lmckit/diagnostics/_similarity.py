"""Representation similarity by linear CKA, between endpoints and along a path.

Linear centred kernel alignment (Kornblith et al. 2019): for representations
``X (n, p)`` and ``Y (n, q)`` of the same ``n`` examples, with columns centred,

    CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F).

It lies in ``[0, 1]``, is 1 for ``Y = X Q`` with ``Q`` orthogonal (hence for any
permutation of units) and invariant to isotropic scaling, but not to general
invertible maps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import Tensor, nn

from lmckit.diagnostics._features import module_features
from lmckit.symmetry._params import Params

__all__ = ["PathCKA", "endpoint_cka", "linear_cka", "path_cka"]


def _centred_rows(x: Tensor) -> Tensor:
    rows = x.reshape(x.shape[0], -1).double()
    return rows - rows.mean(0, keepdim=True)


def linear_cka(x: Tensor, y: Tensor) -> float:
    """Linear CKA of two representations ``(n, ...)`` of the same ``n`` examples.

    Feature axes are flattened. Uses the ``n x n`` Gram form
    ``tr(K L) / (||K||_F ||L||_F)`` (``K = X X^T``, ``L = Y Y^T``) when that is smaller
    than the feature form.
    """
    if x.ndim < 2 or y.ndim < 2 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"need (n, ...) representations of the same examples, got {tuple(x.shape)} and "
            f"{tuple(y.shape)}"
        )
    if x.shape[0] < 2:
        raise ValueError("CKA needs at least 2 examples")
    a, b = _centred_rows(x), _centred_rows(y)
    n, p, q = a.shape[0], a.shape[1], b.shape[1]
    if n * n < p * q:
        k, ell = a @ a.T, b @ b.T
        cross = (k * ell).sum()
        norm_a, norm_b = k.norm(), ell.norm()
    else:
        cross = (b.T @ a).pow(2).sum()
        norm_a, norm_b = (a.T @ a).norm(), (b.T @ b).norm()
    if float(norm_a) == 0.0 or float(norm_b) == 0.0:
        raise ValueError("CKA is undefined for a constant representation")
    return float(cross / (norm_a * norm_b))


def endpoint_cka(
    model: nn.Module, params_a: Params, params_b: Params, x: Tensor, sites: Sequence[str]
) -> dict[str, float]:
    """``{site: CKA(f_site(theta_a), f_site(theta_b))}`` on the examples ``x``."""
    fa = module_features(model, params_a, x, sites)
    fb = module_features(model, params_b, x, sites)
    return {s: linear_cka(fa[s], fb[s]) for s in sites}


@dataclass(frozen=True)
class PathCKA:
    """CKA of each point's representations with those of the two endpoints.

    Attributes:
        t: path positions.
        to_a: ``{site: [CKA(f(theta(t)), f(theta(0))) for t]}``.
        to_b: ``{site: [CKA(f(theta(t)), f(theta(1))) for t]}``.
    """

    t: list[float]
    to_a: dict[str, list[float]] = field(default_factory=dict)
    to_b: dict[str, list[float]] = field(default_factory=dict)


def path_cka(
    model: nn.Module,
    point: Callable[[float], Params],
    x: Tensor,
    sites: Sequence[str],
    ts: Sequence[float],
) -> PathCKA:
    """CKA between the representations at ``point(t)`` and at the ends ``point(0)``, ``point(1)``.

    Args:
        model: module of the architecture.
        point: the path, ``t -> theta(t)`` (a linear path, a curve's ``point``...).
        x: examples ``(n, ...)``.
        sites: modules whose outputs are compared.
        ts: path positions in ``[0, 1]``.
    """
    if not ts or any(not 0.0 <= t <= 1.0 for t in ts):
        raise ValueError("ts must be a non-empty sequence of values in [0, 1]")
    fa = module_features(model, point(0.0), x, sites)
    fb = module_features(model, point(1.0), x, sites)
    to_a: dict[str, list[float]] = {s: [] for s in sites}
    to_b: dict[str, list[float]] = {s: [] for s in sites}
    for t in ts:
        ft = module_features(model, point(float(t)), x, sites)
        for s in sites:
            to_a[s].append(linear_cka(ft[s], fa[s]))
            to_b[s].append(linear_cka(ft[s], fb[s]))
    return PathCKA([float(t) for t in ts], to_a, to_b)
