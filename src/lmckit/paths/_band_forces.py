"""The forces on an elastic band's nodes (Henkelman & Jonsson 2000), on flat coordinates.

A band's nodes are the rows of a ``(nodes, D)`` tensor (row 0 and the last row are the
fixed ends); the losses and loss gradients at the nodes come from the caller. Used by
:mod:`lmckit.paths._neb`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["improved_tangent", "nudged_force", "redistribute_evenly"]


def improved_tangent(coords: Tensor, losses: Tensor, i: int) -> Tensor:
    """Henkelman & Jonsson's improved tangent at interior node ``i``, unit length."""
    forward, backward = coords[i + 1] - coords[i], coords[i] - coords[i - 1]
    low, here, high = float(losses[i - 1]), float(losses[i]), float(losses[i + 1])
    if high > here > low:
        tau = forward
    elif high < here < low:
        tau = backward
    else:  # a local extremum along the band: both neighbours, weighted by the loss steps
        big = max(abs(high - here), abs(low - here))
        small = min(abs(high - here), abs(low - here))
        tau = forward * big + backward * small if high > low else forward * small + backward * big
        if float(tau.norm()) == 0.0:
            tau = forward + backward
    return tau / tau.norm().clamp_min(1e-30)


def nudged_force(coords: Tensor, losses: Tensor, grads: Tensor, spring: float) -> Tensor:
    """The force of every node, as a gradient to descend (zero rows at the ends)."""
    force = torch.zeros_like(coords)
    for i in range(1, coords.shape[0] - 1):
        tau = improved_tangent(coords, losses, i)
        g = grads[i]
        force[i] = g - (g @ tau) * tau
        if math.isfinite(spring):
            stretch = (coords[i + 1] - coords[i]).norm() - (coords[i] - coords[i - 1]).norm()
            force[i] -= spring * stretch * tau
    return force


def redistribute_evenly(coords: Tensor) -> None:
    """Move the interior nodes to even spacing along the chain, in place (``k = inf``)."""
    lengths = (coords[1:] - coords[:-1]).norm(dim=1)
    cumulative = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    source = coords.clone()
    n = coords.shape[0] - 1
    for i in range(1, n):
        target = cumulative[-1] * i / n
        j = int(torch.searchsorted(cumulative, target, right=True)) - 1
        j = min(max(j, 0), n - 1)
        u = (target - cumulative[j]) / (cumulative[j + 1] - cumulative[j]).clamp_min(1e-30)
        coords[i] = (1 - u) * source[j] + u * source[j + 1]
