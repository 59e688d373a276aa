"""Multilayer perceptron: Linear -> [norm] -> activation, repeated."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lmckit.models._registry import ZooModel, check_size_list, check_sizes, register_model

__all__ = ["MLP"]


def _make_activation(name: str) -> nn.Module:
    if name == "relu":
        return nn.ReLU()
    if name == "gelu":
        return nn.GELU()
    raise ValueError(f"unknown activation {name!r}; choose relu or gelu")


def _make_norm1d(norm: str, width: int) -> nn.Module:
    if norm == "none":
        return nn.Identity()
    if norm == "batch":
        return nn.BatchNorm1d(width)
    if norm == "layer":
        return nn.LayerNorm(width)
    raise ValueError(f"unknown norm {norm!r} for an MLP; choose none, batch or layer")


@register_model("mlp")
class MLP(ZooModel):
    """``in_features -> hidden[0] -> ... -> hidden[-1] -> out_features``.

    Inputs of any shape ``(batch, ...)`` are flattened. Each hidden layer is
    ``Linear -> norm -> activation``; the hidden layers' units are the permutation
    spaces ``hidden.0``, ``hidden.1``, ...
    """

    space_names = {"layers.{i}": "hidden.{i}"}

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int],
        out_features: int,
        *,
        activation: str = "relu",
        norm: str = "none",
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_sizes("mlp", in_features=in_features, out_features=out_features)
        check_size_list("mlp", "hidden", hidden)
        widths = [in_features, *hidden]
        self.layers = nn.ModuleList(
            nn.Linear(widths[i], widths[i + 1], bias=bias) for i in range(len(hidden))
        )
        self.norms = nn.ModuleList(_make_norm1d(norm, w) for w in hidden)
        self.acts = nn.ModuleList(_make_activation(activation) for _ in hidden)
        self.head = nn.Linear(widths[-1], out_features, bias=bias)
        self.hidden = list(hidden)
        self.in_features = in_features
        self.norm = norm

    def forward(self, x: Tensor) -> Tensor:
        x = x.flatten(1)
        for layer, norm, act in zip(self.layers, self.norms, self.acts, strict=True):
            x = act(norm(layer(x)))
        return self.head(x)

    def example_inputs(self) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        return (torch.randn(2, self.in_features, generator=gen),)

    def repair_sites(self) -> list[str]:
        if self.norm == "none":
            return [f"layers.{i}" for i in range(len(self.hidden))]
        return [f"norms.{i}" for i in range(len(self.hidden))]
