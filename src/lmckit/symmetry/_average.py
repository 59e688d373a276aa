"""Weighted averages of parameter sets: merges and the points of linear paths.

Floating tensors are summed in float32 at least and rounded once to the result's dtype;
a large bfloat16 result is summed a block of rows at a time, so no float32 copy of it
sits beside the result. Integer tensors come from the first model.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from lmckit.symmetry._params import Params, check_compatible

__all__ = ["WIDE_CHUNK_BYTES", "average_tensor", "interpolate", "weighted_average"]

#: a merge rounded to a narrower dtype than it is summed in is summed this many bytes at a
#: time (rows of the tensor)
WIDE_CHUNK_BYTES = 2**24


def weighted_average(
    models: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    *,
    dtype: torch.dtype | None = None,
) -> Params:
    """``sum_k w_k theta_k`` over floating-point tensors; other tensors come from the first.

    Each tensor keeps the first model's dtype, or takes ``dtype``; bfloat16 and float16
    ones are summed in float32 and rounded once (if at all).

    Args:
        models: parameter sets of one architecture.
        weights: one finite real weight per model (convex weights for a merge, but any
            are allowed).
        dtype: floating dtype of the result's floating tensors (default: as stored);
            e.g. float32 to evaluate an average of bfloat16 models without rounding it.
    """
    for w in weights:
        _check_weight(w, "each weight")
    if len(models) != len(weights) or not models:
        raise ValueError(
            f"need one weight per model, got {len(models)} models, {len(weights)} weights"
        )
    for other in models[1:]:
        check_compatible(models[0], other)
    return {
        name: average_tensor([m[name] for m in models], weights, dtype=dtype) for name in models[0]
    }


def average_tensor(
    values: Sequence[Tensor], weights: Sequence[float], *, dtype: torch.dtype | None = None
) -> Tensor:
    """``sum_k w_k v_k`` for one tensor of :func:`weighted_average` (a copy of the first
    for integer tensors): summed in float32 at least, rounded once to ``dtype`` (default:
    the first's)."""
    first = values[0]
    if not first.is_floating_point():
        return first.clone()
    want = dtype or first.dtype
    wide = torch.promote_types(torch.promote_types(first.dtype, torch.float32), want)
    if want != wide and first.dim() and first.numel() * wide.itemsize > WIDE_CHUNK_BYTES:
        # a bfloat16 result summed in float32 a block of rows at a time: no float32 copy
        # of a large tensor (an embedding) beside the result
        out = torch.empty_like(first, dtype=want)
        rows = max(1, WIDE_CHUNK_BYTES * first.shape[0] // (first.numel() * wide.itemsize))
        for start in range(0, first.shape[0], rows):
            block = [v[start : start + rows] for v in values]
            out[start : start + rows] = _summed(block, weights, wide)
        return out
    return _summed(values, weights, wide).to(want)


def _summed(values: Sequence[Tensor], weights: Sequence[float], wide: torch.dtype) -> Tensor:
    # the first term written, not added to zeros: one pass less over the tensor (a
    # streamed path point is rebuilt for every batch), the same sums
    acc = values[0].to(wide, copy=True).mul_(float(weights[0]))
    for w, v in zip(weights[1:], values[1:], strict=True):
        acc.add_(v, alpha=float(w))
    return acc


def _check_weight(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a finite real number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite real number, got {value}")


def interpolate(
    a: Mapping[str, Tensor],
    b: Mapping[str, Tensor],
    t: float,
    *,
    dtype: torch.dtype | None = None,
) -> Params:
    """The point ``(1 - t) * a + t * b`` of the linear path (integer tensors from ``a``).

    ``t`` is a finite real number (0 gives ``a``, 1 gives ``b``; outside ``[0, 1]`` the
    line is extrapolated). ``dtype``: of the point's floating tensors (default: ``a``'s).
    """
    _check_weight(t, "t")
    return weighted_average([a, b], [1.0 - t, t], dtype=dtype)
