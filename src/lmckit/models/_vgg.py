"""VGG-style CNN: (conv3x3 -> norm -> ReLU | max-pool)*, global average pool, Linear."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lmckit.models._norms import check_conv_norm, conv_bias, make_norm2d
from lmckit.models._registry import ZooModel, check_sizes, register_model

__all__ = ["VGG", "VGG11_WIDTHS"]

#: VGG11's layout: channel counts of 3x3 convolutions, ``"M"`` for a 2x2 max-pool.
VGG11_WIDTHS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
POOL = "M"


@register_model("vgg")
class VGG(ZooModel):
    """``(batch, in_channels, image_size, image_size) -> (batch, num_classes)`` logits.

    ``features`` is an ``nn.Sequential`` of ``Conv2d(3x3, padding 1) -> norm -> ReLU``
    triples and 2x2 max-pools; a pool is skipped where the map is already smaller than
    2x2. Then a global average pool to ``(batch, C)`` and the ``classifier`` Linear.

    Each convolution's output channels form one permutation space named after the
    convolution (``features.0``, ``features.3``, ...): the conv and its norm write it,
    the next conv (or the classifier) reads it, the ReLU after it is its probe.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        widths: Sequence[int | str] = VGG11_WIDTHS,
        width_mult: float = 1.0,
        norm: str = "batch",
    ) -> None:
        super().__init__()
        check_conv_norm(norm)
        check_sizes("vgg", in_channels=in_channels, num_classes=num_classes, image_size=image_size)
        if not (isinstance(width_mult, int | float) and 0 < width_mult < float("inf")):
            raise ValueError(f"vgg: width_mult must be a positive number, got {width_mult!r}")
        self.norm = norm
        self.image_size, self.in_channels = image_size, in_channels
        layers: list[nn.Module] = []
        #: ``(conv index, norm index, relu index, out channels)`` per conv, in order.
        self.conv_sites: list[tuple[int, int, int, int]] = []
        channels, size = in_channels, image_size
        for entry in widths:
            if entry == POOL:
                if size >= 2:
                    layers.append(nn.MaxPool2d(2))
                    size //= 2
                continue
            if isinstance(entry, bool) or not isinstance(entry, int) or entry < 1:
                raise ValueError(f"widths entries must be positive ints or {POOL!r}, got {entry!r}")
            out = max(1, round(entry * width_mult))
            first = len(layers)
            layers += [
                nn.Conv2d(channels, out, 3, padding=1, bias=conv_bias(norm)),
                make_norm2d(norm, out),
                nn.ReLU(),
            ]
            self.conv_sites.append((first, first + 1, first + 2, out))
            channels = out
        if not self.conv_sites:
            raise ValueError("widths must contain at least one convolution")
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, in_channels, H, W) -> (batch, num_classes)``."""
        return self.classifier(self.pool(self.features(x)).flatten(1))

    def example_inputs(self) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        size = self.image_size
        return (torch.randn(2, self.in_channels, size, size, generator=gen),)

    def repair_sites(self) -> list[str]:
        pick = 0 if self.norm == "none" else 1
        return [f"features.{site[pick]}" for site in self.conv_sites]
