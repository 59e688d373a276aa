"""Op rules, part 3 (continued): pooling and resampling, which keep the channels and
pin the spatial axes; a max reads each channel alone (permutations only)."""

from __future__ import annotations

from typing import Any

from torch.fx import Node

from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._lattice import Level
from lmckit.inference._rules import _ops, out_shapes, register

__all__: list[str] = []


@register(*_ops("max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices"))
@register(*_ops("adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"))
@register(*_ops("avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d"))
@register(*_ops("adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d"))
@register(*_ops("upsample_nearest2d", "upsample_bilinear2d", "upsample_nearest1d"))
def _pool(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x = args[0]
    name = str(node.target)
    spatial = next((int(c) for c in name if c in "123"), 2)
    ch = x.ndim - spatial - 1
    shapes = out_shapes(node)
    shape = shapes[0] if isinstance(shapes[0], tuple) else shapes
    if "max" in name:
        an.lattice.lower(x.axes[ch], Level.PERM, f"{name} (node {node.name!r}) per channel")
    axes = [list(a) for a in x.axes[: ch + 1]]
    axes += [[an.lattice.fresh(s, Level.FREE, "spatial")] for s in shape[ch + 1 :]]
    out = Value(axes)
    if isinstance(shapes[0], tuple):
        return (out, an.free(shapes[1], "pooling indices"))
    return out
