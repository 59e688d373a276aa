"""Symmetry-broken layers: Linear and Conv2d with effective weight ``M ⊙ W + C``.

The construction and its modes are described in
:mod:`lmckit.experiments._identifiability._asymmetric`; this module holds the per-layer
parts (mask, offset, fold) and the in-place swap of a
model's layers, :func:`asymmetrize`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MODES", "AsymConv2d", "AsymLinear", "asym_parts", "asymmetrize", "fold_weight"]

MODES = ("wasym", "syre")


def _layer_generator(seed: int, layer: int) -> torch.Generator:
    # one independent stream per (seed, layer): the same layer gets the same draw in
    # every run, and layers do not share draws
    state = np.random.SeedSequence([int(seed), int(layer)]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


def asym_parts(
    shape: Sequence[int],
    *,
    kappa: float,
    num_fixed: int,
    mode: str,
    mask_seed: int,
    fixed_seed: int,
    layer: int,
) -> tuple[Tensor, Tensor]:
    """Mask ``M`` and offset ``C`` of one layer (both of ``shape``, ``(out, ...)``).

    ``wasym``: ``num_fixed`` entries per row of the flattened ``(out, fan_in)`` weight
    are fixed, chosen uniformly without replacement; ``C = (1 - M) ⊙ κF``.
    ``syre``: ``M = 1``, ``C = κF``. ``F ~ N(0, 1)`` i.i.d.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not math.isfinite(kappa) or kappa < 0:
        raise ValueError(f"kappa must be a finite number >= 0, got {kappa}")
    out = int(shape[0])
    fan_in = math.prod(shape[1:])
    fixed = torch.randn(tuple(shape), generator=_layer_generator(fixed_seed, layer))
    if mode == "syre":
        return torch.ones(tuple(shape)), kappa * fixed
    if not 0 <= num_fixed <= fan_in:
        raise ValueError(f"num_fixed must be in [0, {fan_in}] for weight {tuple(shape)}")
    scores = torch.rand(out, fan_in, generator=_layer_generator(mask_seed, layer))
    chosen = scores.argsort(dim=1)[:, :num_fixed]
    mask = torch.ones(out, fan_in).scatter_(1, chosen, 0.0).reshape(tuple(shape))
    return mask, (1 - mask) * kappa * fixed


def fold_weight(weight: Tensor, mask: Tensor, offset: Tensor) -> Tensor:
    """Effective weight ``M ⊙ W + C``."""
    if not weight.shape == mask.shape == offset.shape:
        raise ValueError(
            f"weight {tuple(weight.shape)}, mask {tuple(mask.shape)} and offset "
            f"{tuple(offset.shape)} must have one shape"
        )
    return mask * weight + offset


class _AsymWeight(nn.Module):
    """A weight ``W`` (parameter), bias, and fixed ``mask``/``offset`` buffers."""

    weight: nn.Parameter
    mask: Tensor
    offset: Tensor

    def _init_parts(
        self, weight: Tensor, bias: Tensor | None, mask: Tensor, offset: Tensor
    ) -> None:
        # fixed entries of W never matter; zero them so the parameters are tidy
        self.weight = nn.Parameter(weight.detach() * mask)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.register_buffer("mask", mask)
        self.register_buffer("offset", offset)

    def effective_weight(self) -> Tensor:
        """``M ⊙ W + C``: the weight of the equivalent plain layer."""
        return self.mask * self.weight + self.offset


class AsymLinear(_AsymWeight):
    """``y = x (M ⊙ W + C)^T + b``; ``x: (..., in_features) -> (..., out_features)``."""

    def __init__(self, linear: nn.Linear, mask: Tensor, offset: Tensor) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._init_parts(linear.weight, linear.bias, mask, offset)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.effective_weight(), self.bias)


class AsymConv2d(_AsymWeight):
    """A Conv2d with weight ``M ⊙ W + C`` (``(out, in, kh, kw)``); same stride/padding."""

    def __init__(self, conv: nn.Conv2d, mask: Tensor, offset: Tensor) -> None:
        super().__init__()
        if conv.padding_mode != "zeros":
            raise ValueError("only zero-padded convolutions can be made asymmetric")
        self.stride, self.padding = conv.stride, conv.padding
        self.dilation, self.groups = conv.dilation, conv.groups
        self._init_parts(conv.weight, conv.bias, mask, offset)

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(
            x,
            self.effective_weight(),
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )


def asymmetrize(
    model: nn.Module,
    *,
    kappa: float,
    num_fixed: int | Sequence[int] | None,
    mode: str,
    mask_seed: int,
    fixed_seed: int,
    select: Callable[[str], bool] | None = None,
) -> list[str]:
    """Replace the Linear/Conv2d layers of ``model`` in place; return their names in order.

    ``num_fixed``: one count for all layers, one per layer, or ``None`` for an eighth
    of each row's entries (at least one). ``select(name)`` picks the layers by module
    name (default: all); layer ``k`` of the selection draws stream ``k`` of each seed.
    """
    targets = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear | nn.Conv2d) and (select is None or select(name))
    ]
    if isinstance(num_fixed, Sequence):
        counts = [int(c) for c in num_fixed]
        if len(counts) != len(targets):
            raise ValueError(
                f"num_fixed lists {len(counts)} counts for {len(targets)} layers "
                f"({', '.join(n for n, _ in targets)})"
            )
    else:
        counts = [
            max(1, math.prod(m.weight.shape[1:]) // 8) if num_fixed is None else int(num_fixed)
            for _, m in targets
        ]
    for layer, ((name, module), count) in enumerate(zip(targets, counts, strict=True)):
        mask, offset = asym_parts(
            module.weight.shape,
            kappa=kappa,
            num_fixed=count,
            mode=mode,
            mask_seed=mask_seed,
            fixed_seed=fixed_seed,
            layer=layer,
        )
        new: nn.Module
        if isinstance(module, nn.Linear):
            new = AsymLinear(module, mask, offset)
        else:
            new = AsymConv2d(module, mask, offset)
        parent, _, leaf = name.rpartition(".")
        model.get_submodule(parent).register_module(leaf, new)
    return [name for name, _ in targets]
