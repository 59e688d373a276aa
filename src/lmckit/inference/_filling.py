"""Op rules, part 5: filling an axis -- padding it, or writing blocks of a new tensor.

Both glue an axis from blocks (:meth:`~lmckit.inference._lattice.Lattice.join`), as a
concatenation does:

* ``pad`` in constant mode puts blocks of one value before and after an axis. Along a
  pinned axis (positions of an image's windows) nothing changes for the feature axes;
  along a feature axis the padded axis is the direct sum of a pinned block, the axis's
  own space and a pinned block. Other modes copy entries of the axis by position
  (reflection, replication): harmless on a pinned axis, they pin a feature axis.
* ``copy_`` into slices of a tensor the graph has just made (``new_empty``, ``zeros``):
  the tensor read after the last copy holds each source in its block, a concatenation
  written in place (DeepSeek's key: the heads' own features beside the rotary features
  they share). Anything else an in-place copy does is not understood.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._graph import op_name
from lmckit.inference._lattice import Level, Var
from lmckit.inference._rules import _ops, axis_size, copy_value, out_shapes, register, unknown_op

__all__: list[str] = []

aten = torch.ops.aten

#: ops that make a new tensor whose entries the graph then writes
_NEW = {
    "new_empty", "empty", "empty_like", "new_zeros", "zeros", "zeros_like", "new_full", "full",
    "full_like", "new_ones", "ones", "ones_like", "empty_strided", "new_empty_strided",
}  # fmt: skip
_REFLECTING = tuple(f"{kind}_pad{n}d" for kind in ("reflection", "replication") for n in (1, 2, 3))


def _is_free(an: Analysis, factors: Sequence[Var]) -> bool:
    return all(v.level == Level.FREE for v in an.lattice.leaves(factors))


def _padded(an: Analysis, x: Value, dim: int, before: int, after: int, why: str) -> list[Var]:
    """The factors of axis ``dim`` of ``x`` after constant padding: ``before`` and
    ``after`` pinned entries around its own space."""
    blocks: list[list[Var]] = []
    if before:
        blocks.append([an.lattice.fresh(before, Level.FREE, "padding")])
    blocks.append(list(x.axes[dim]))
    if after:
        blocks.append([an.lattice.fresh(after, Level.FREE, "padding")])
    glued = an.lattice.join(blocks, why)
    return [glued] if glued is not None else []


@register(*_ops("pad", "constant_pad_nd", *_REFLECTING))
def _pad(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    pads = [int(p) for p in args[1]]
    name = op_name(node)
    if name == "pad":
        mode = kw.get("mode", args[2] if len(args) > 2 else "constant")
    else:
        mode = "constant" if name == "constant_pad_nd" else "reflect"
    shape = out_shapes(node)
    out = copy_value(x)
    what = f"{node.target} (node {node.name!r})"
    for k in range(len(pads) // 2):
        dim = x.ndim - 1 - k  # pads run from the last axis backwards, (before, after) each
        before, after = pads[2 * k], pads[2 * k + 1]
        if before == after == 0:
            continue
        out.src[dim] = frozenset()
        factors: list[Var] = []
        if not _is_free(an, x.axes[dim]) and not x.const:
            if mode == "constant" and before >= 0 and after >= 0:
                factors = _padded(an, x, dim, before, after, what)
            if not factors:
                an.pin([Value([x.axes[dim]])], f"{what} pads a feature axis", notable=True)
        out.axes[dim] = factors or [an.lattice.fresh(shape[dim], Level.FREE, "padded")]
    return out


# --------------------------------------------------------------------------- copy_


def _destination(node: Node) -> tuple[Node, int | None, int, int] | None:
    """``(new tensor, axis, start, length)`` of the block ``copy_`` node ``node`` writes:
    a step-1 slice of a tensor the graph made (axis None: the whole tensor); else None."""
    dst = node.args[0]
    if not isinstance(dst, Node):
        return None
    if op_name(dst) in _NEW:
        return dst, None, 0, 0
    if op_name(dst) != "slice" or not isinstance(dst.args[0], Node):
        return None
    base = dst.args[0]
    if any(a is not None and not isinstance(a, int) for a in dst.args[1:5]):
        return None  # offsets that are not numbers
    given = [a if isinstance(a, int) else None for a in dst.args[1:5]] + [None] * 4
    dim, begin, step = given[0] or 0, given[1] or 0, given[3]
    if op_name(base) not in _NEW or step not in (None, 1):
        return None
    shape = tuple(base.meta["val"].shape)
    dim %= len(shape)
    start = begin + shape[dim] if begin < 0 else begin
    return base, dim, start, int(dst.meta["val"].shape[dim])


def _copies_into(base: Node) -> list[Node]:
    """The ``copy_`` nodes writing into ``base`` or a slice of it, in graph order."""
    found = []
    node = base.next
    while node.op != "root":
        if op_name(node) == "copy_" and (found_at := _destination(node)) is not None:
            if found_at[0] is base:
                found.append(node)
        node = node.next
    return found


def _written_before_read(base: Node, copies: list[Node]) -> bool:
    """Whether every use of ``base`` before its last copy is a slice written by a copy
    (nothing reads it half filled)."""
    targets = {c.args[0] for c in copies}
    last = copies[-1]
    node = base.next
    while node is not last:
        if base in node.all_input_nodes and node not in targets:
            return False
        node = node.next
    slices = [t for t in targets if isinstance(t, Node) and t is not base]
    return all(all(u in copies for u in t.users) for t in slices)


def _filled(an: Analysis, base: Node, copies: list[Node]) -> Value | None:
    """The value of ``base`` once every copy wrote its block, or None."""
    shape = tuple(int(s) for s in base.meta["val"].shape)
    blocks: list[tuple[int, int, Value]] = []
    dims = set()
    for copy in copies:
        found = _destination(copy)
        source = an.values.get(copy.args[1].name) if isinstance(copy.args[1], Node) else None
        if found is None or not isinstance(source, Value) or source.ndim != len(shape):
            return None
        _, dim, start, length = found
        dims.add(dim)
        blocks.append((start, length, source))
    if len(dims) != 1:
        return None
    (dim,) = dims
    if dim is None:
        return copy_value(blocks[0][2], keep_src=False) if len(blocks) == 1 else None
    blocks.sort(key=lambda b: b[0])
    what = f"copies into {base.name!r}"
    glued: list[list[Var]] = []
    at = 0
    for start, length, source in blocks:
        if start < at or axis_size(source, dim) != length:
            return None  # overlapping blocks, or a source broadcast along the axis
        if start > at:
            glued.append([an.lattice.fresh(start - at, Level.FREE, "never written")])
        glued.append(list(source.axes[dim]))
        at = start + length
    if at < shape[dim]:
        glued.append([an.lattice.fresh(shape[dim] - at, Level.FREE, "never written")])
    first = blocks[0][2]
    for _, _, source in blocks[1:]:
        for i in range(len(shape)):
            if i != dim and axis_size(source, i) != axis_size(first, i):
                return None
            if i != dim:
                an.unify(first.axes[i], source.axes[i], what)
    axes = [list(a) for a in first.axes]
    whole = an.lattice.join(glued, what)
    axes[dim] = [whole] if whole is not None else [an.lattice.fresh(shape[dim], Level.FREE, what)]
    return Value(axes, const=all(b[2].const for b in blocks))


@register(aten.copy_)
def _copy_into(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    """``copy_`` into a new tensor: deferred to the last copy into it, which sets the
    tensor's value from every block (see the module docstring)."""
    found = _destination(node)
    copies = _copies_into(found[0]) if found is not None else []
    if found is None or node not in copies:
        return unknown_op(an, node, args, kw)
    if node is not copies[-1]:
        return copy_value(args[0])
    base = found[0]
    value = _filled(an, base, copies) if _written_before_read(base, copies) else None
    if value is None:
        sources = [an.values.get(c.args[1].name) for c in copies if isinstance(c.args[1], Node)]
        an.pin(
            [s for s in sources if isinstance(s, Value)],
            f"copies into {base.name!r} are not understood",
            notable=True,
        )
        return copy_value(args[0])
    an.values[base.name] = value
    return copy_value(args[0])
