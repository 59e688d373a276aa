"""Normalisation layers for convolutional zoo models, and the symmetry each one keeps.

Options (``norm=``):

* ``"none"``: no normalisation (``nn.Identity``); convolutions then carry a bias.
* ``"batch"``: ``nn.BatchNorm2d(C)``.
* ``"layer"``: ``nn.GroupNorm(1, C)``, i.e. LayerNorm over ``(C, H, W)`` with a
  per-channel affine; equivariant under every channel permutation.
* ``"group"``: ``nn.GroupNorm(G, C)`` with ``G = group_norm_groups(C)``, the largest
  divisor of ``C`` not above :data:`MAX_GROUPS` (so ``G = 8`` whenever ``8`` divides
  ``C``). GroupNorm normalises each of ``G`` contiguous blocks of ``C / G`` channels,
  so it is equivariant only under permutations that map blocks onto blocks
  (symmetry inference gives such spaces ``Permutation(blocks=G)``).

``G`` depends on ``C`` alone, so all modules writing into one space (same ``C``)
share the same ``G``.
"""

from __future__ import annotations

from torch import nn

__all__ = [
    "CONV_NORMS",
    "MAX_GROUPS",
    "check_conv_norm",
    "conv_bias",
    "group_norm_groups",
    "make_norm2d",
]

CONV_NORMS: tuple[str, ...] = ("none", "batch", "layer", "group")
#: upper bound on the number of GroupNorm groups for ``norm="group"``.
MAX_GROUPS = 8


def check_conv_norm(norm: str) -> None:
    """Raise ``ValueError`` unless ``norm`` is one of :data:`CONV_NORMS`."""
    if norm not in CONV_NORMS:
        raise ValueError(f"unknown norm {norm!r} for a CNN; choose {', '.join(CONV_NORMS)}")


def group_norm_groups(channels: int) -> int:
    """Number of GroupNorm groups for ``channels``: its largest divisor ``<= MAX_GROUPS``."""
    if channels < 1:
        raise ValueError(f"need at least one channel, got {channels}")
    return max(g for g in range(1, min(MAX_GROUPS, channels) + 1) if channels % g == 0)


def make_norm2d(norm: str, channels: int) -> nn.Module:
    """Norm layer for ``(batch, channels, height, width)`` maps; shape preserving."""
    check_conv_norm(norm)
    if norm == "none":
        return nn.Identity()
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "layer":
        return nn.GroupNorm(1, channels)
    return nn.GroupNorm(group_norm_groups(channels), channels)


def conv_bias(norm: str) -> bool:
    """Whether a convolution followed by ``norm`` needs its own bias (only without a norm)."""
    check_conv_norm(norm)
    return norm == "none"
