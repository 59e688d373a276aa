"""Parameter sets as flat vectors: what an elastic band's coordinates are made of."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from lmckit.symmetry._params import Params

__all__ = ["FlatPacking"]


class FlatPacking:
    """The named tensors of a parameter set as one flat float32 vector, and back.

    Args:
        names: the tensors to pack (e.g. a module's trainable parameters), in order.
        like: a parameter set holding them (their shapes).
    """

    def __init__(self, names: Sequence[str], like: Params) -> None:
        self.names = list(names)
        self.shapes = [like[n].shape for n in self.names]
        self.sizes = [like[n].numel() for n in self.names]
        self._packed = set(self.names)

    def pack(self, params: Mapping[str, Tensor]) -> Tensor:
        """The named tensors, flattened and concatenated: ``(D,)`` float32."""
        return torch.cat([params[n].detach().reshape(-1).float() for n in self.names])

    def unpack(self, row: Tensor, base: Params) -> Params:
        """``base`` with the trainable tensors taken from ``row`` (views, so gradients
        reach it); the other tensors are copies (BatchNorm updates what it is handed)."""
        out = {k: v.clone() for k, v in base.items() if k not in self._packed}
        for name, piece, shape in zip(
            self.names, torch.split(row, self.sizes), self.shapes, strict=True
        ):
            out[name] = piece.view(shape)
        return out
