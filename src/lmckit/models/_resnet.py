"""CIFAR-style ResNet20: a stem, 3 stages x 3 BasicBlocks, global average pool, Linear."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmckit.models._norms import check_conv_norm, conv_bias, make_norm2d
from lmckit.models._registry import ZooModel, check_sizes, register_model

__all__ = ["BasicBlock", "ProjectionShortcut", "ResNet20"]

#: channels of the three stages at ``width_mult = 1``.
STAGE_WIDTHS = (16, 32, 64)
BLOCKS_PER_STAGE = 3

_Named = tuple[str, nn.Module]


class ProjectionShortcut(nn.Module):
    """``conv1x1(stride) -> norm``: ``(B, C_in, H, W) -> (B, C_out, H / stride, W / stride)``."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=conv_bias(norm))
        self.norm = make_norm2d(norm, out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.conv(x))


class BasicBlock(nn.Module):
    """``relu_out(norm2(conv2(relu1(norm1(conv1(x))))) + shortcut(x))``.

    ``(B, C_in, H, W) -> (B, C_out, H / stride, W / stride)``; the shortcut is the
    identity when the shape is kept, else a :class:`ProjectionShortcut`.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str) -> None:
        super().__init__()
        bias = conv_bias(norm)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=bias)
        self.norm1 = make_norm2d(norm, out_channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=bias)
        self.norm2 = make_norm2d(norm, out_channels)
        self.shortcut: nn.Module
        if stride != 1 or in_channels != out_channels:
            self.shortcut = ProjectionShortcut(in_channels, out_channels, stride, norm)
        else:
            self.shortcut = nn.Identity()
        self.relu_out = nn.ReLU()

    @property
    def projects(self) -> bool:
        return isinstance(self.shortcut, ProjectionShortcut)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.relu1(self.norm1(self.conv1(x)))
        return self.relu_out(self.norm2(self.conv2(hidden)) + self.shortcut(x))


@register_model("resnet20")
class ResNet20(ZooModel):
    """``(batch, in_channels, H, W) -> (batch, num_classes)`` logits.

    Stem ``conv3x3 -> norm -> ReLU`` to ``16k`` channels, then stages of ``16k``,
    ``32k`` and ``64k`` channels (``k = width_mult``; stride 2 in the first block of
    stages 2 and 3), global average pool, ``classifier`` Linear.

    Spaces:

    * ``residual.{s}`` (one per stage): the stage's residual stream. Written by the
      stem (stage 0) or the first block's projection shortcut (stages 1, 2) and by
      every block's ``conv2``/``norm2``; read by the ``conv1`` of the blocks fed by the
      stream, the next stage's shortcut conv, or the classifier. Probes: the stem's
      ReLU (stage 0) and each block's ``relu_out``.
    * ``stages.{s}.{b}.conv1`` (one per block): the block's inner channels, written by
      ``conv1``/``norm1``, read by ``conv2``, probed at ``relu1``.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width_mult: int = 1,
        norm: str = "batch",
    ) -> None:
        super().__init__()
        check_conv_norm(norm)
        if isinstance(width_mult, bool) or not isinstance(width_mult, int) or width_mult < 1:
            raise ValueError(f"width_mult must be a positive int, got {width_mult!r}")
        check_sizes("resnet20", in_channels=in_channels, num_classes=num_classes)
        self.norm = norm
        self.widths = [w * width_mult for w in STAGE_WIDTHS]
        self.stem_conv = nn.Conv2d(in_channels, self.widths[0], 3, padding=1, bias=conv_bias(norm))
        self.stem_norm = make_norm2d(norm, self.widths[0])
        self.stem_relu = nn.ReLU()
        stages = []
        channels = self.widths[0]
        for s, width in enumerate(self.widths):
            blocks = []
            for b in range(BLOCKS_PER_STAGE):
                stride = 2 if s > 0 and b == 0 else 1
                blocks.append(BasicBlock(channels, width, stride, norm))
                channels = width
            stages.append(nn.ModuleList(blocks))
        self.stages = nn.ModuleList(stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, in_channels, H, W) -> (batch, num_classes)``."""
        x = self.stem_relu(self.stem_norm(self.stem_conv(x)))
        for stage in self.stages:
            for block in stage:
                x = block(x)
        return self.classifier(self.pool(x).flatten(1))

    def _blocks(self) -> list[tuple[int, int, BasicBlock]]:
        blocks: list[tuple[int, int, BasicBlock]] = []
        for s, stage in enumerate(self.stages):
            assert isinstance(stage, nn.ModuleList)
            for b, block in enumerate(stage):
                assert isinstance(block, BasicBlock)
                blocks.append((s, b, block))
        return blocks

    def example_inputs(self) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        # three stages halve 16x16 twice: every layer sees a spatial map
        return (torch.randn(2, self.stem_conv.in_channels, 16, 16, generator=gen),)

    def repair_sites(self) -> list[str]:
        kind = "conv" if self.norm == "none" else "norm"  # modules are named alike
        sites = [f"stem_{kind}"]
        for s, b, block in self._blocks():
            name = f"stages.{s}.{b}"
            sites += [f"{name}.{kind}1", f"{name}.{kind}2"]
            if block.projects:
                sites.append(f"{name}.shortcut.{kind}")
        return sites
