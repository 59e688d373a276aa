"""Op rules, part 4: slicing and joining -- what cutting or gluing an axis allows.

A slice, a selected index or an indexed gather along a pinned axis (tokens, positions,
batch) is harmless; along a feature axis it would need to know which units survive, so
the axis is pinned and the reason reported -- except that a block of one feature
variable (a slice by offsets, a constant list of consecutive indices, the chunks of a
split, the entries of an unbind after a view) becomes a variable of its own: a fused
query/key/value projection's blocks each get their own basis. Concatenation joins
streams along a pinned axis (a class token before the patches) and unifies every other
axis. Equal chunks of an axis that is not one variable share one unit variable, so the
chunks move together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._deinterleave import deinterleaved
from lmckit.inference._graph import op_name
from lmckit.inference._lattice import Level, Var
from lmckit.inference._rules import _ops, axis_size, copy_value, out_shapes, register

__all__: list[str] = []

aten = torch.ops.aten


def _is_free(an: Analysis, factors: Sequence[Var]) -> bool:
    return all(v.level == Level.FREE for v in an.lattice.leaves(factors))


@register(aten.slice)
def _slice(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    dim = (args[1] if len(args) > 1 else 0) % x.ndim
    start = args[2] if len(args) > 2 and args[2] is not None else 0
    step = args[4] if len(args) > 4 else 1
    return _take(an, node, x, dim, start, step, f"slice {node.name!r} cuts a feature axis")


def _take(an: Analysis, node: Node, x: Value, dim: int, start: int, step: int, why: str) -> Value:
    """``x`` with entries ``start, start + step, ...`` of axis ``dim`` taken (as many as
    the node's output has): a block of one feature variable becomes a variable of its
    own; any other cut of a feature axis pins it (``why``)."""
    shape = out_shapes(node)
    size = axis_size(x, dim)
    start = max(0, min(size, start + size if start < 0 else start))
    if shape[dim] == size:
        return copy_value(x)
    if shape[dim] == 0:  # nothing taken (partial rotary with every dimension rotary)
        return an.free(shape, "empty slice")
    out = copy_value(x)
    out.src[dim] = frozenset()
    leaves = an.lattice.leaves(x.axes[dim])
    if len(leaves) == 1 and step == 1:
        for cut in (start, min(size, start + shape[dim])):
            if 0 < cut < size:
                an.cuts.append((leaves[0], cut))
        if not _is_free(an, x.axes[dim]) and not x.const:
            block = _product_block(an, x, dim, start, shape[dim])
            if block is not None:
                return block
            # a block of one feature variable (a fused projection's query block): the
            # block becomes a variable of its own
            piece = an.lattice.cut(leaves[0], start, shape[dim])
            if piece is not None:
                out.axes[dim] = [piece]
                return out
    if not _is_free(an, x.axes[dim]):
        an.pin([Value([x.axes[dim]])], why, notable=not x.const)
    out.axes[dim] = [an.lattice.fresh(shape[dim], Level.FREE, "slice")]
    return out


def _product_block(an: Analysis, x: Value, dim: int, start: int, length: int) -> Value | None:
    """``x`` cut to ``[start, start + length)`` along ``dim`` where ``dim`` and the axes
    after it are the factors of one variable, reshaped just before (a fused query/key/value
    projection viewed as ``[heads + 2, head_dim]``): a block of that variable, with a
    head dimension of its own (:meth:`~lmckit.inference._lattice.Lattice.cut_leading`)."""
    lead = an.lattice.leaves(x.axes[dim])
    origin = an.lattice.find(lead[0]).leads if len(lead) == 1 else None
    if origin is None:
        return None
    whole = an.lattice.find(origin)
    # the factors of the whole, however the reshape nested them ((3, heads * head_dim)
    # then (heads, head_dim): three factors)
    count = len(whole.factored or an.lattice.leaves(whole.parts or [])) - 1
    if count < 1 or dim + count >= x.ndim:
        return None
    following = [an.lattice.leaves(a) for a in x.axes[dim + 1 : dim + 1 + count]]
    if any(len(f) != 1 for f in following):
        return None
    factors = an.lattice.cut_leading(lead[0], start, length, [f[0] for f in following])
    if factors is None:
        return None
    out = copy_value(x)
    for k, var in enumerate(factors):
        out.axes[dim + k] = [var]
        out.src[dim + k] = frozenset()
    return out


#: ops that pass a constant through unchanged (export copies lifted constants)
_COPIES = ("lift_fresh_copy", "clone", "_to_copy", "alias", "detach")


def _index_list(an: Analysis, index: Any) -> tuple[int, ...] | None:
    """The entries a constant index list takes (``x[..., [-2], :]``), else None."""
    while isinstance(index, Node) and index.op == "call_function":
        if not any(f"aten.{op}." in str(index.target) for op in _COPIES):
            return None
        index = index.args[0]
    if not isinstance(index, Node) or index.op != "placeholder":
        return None
    return an.traced.indices.get(index.name)


def _as_range(entries: Sequence[int], size: int) -> int | None:
    """The start of ``entries`` when they are ``start, start + 1, ...`` (negative
    entries counted from the end, as indexing does), else None."""
    at = [e + size if e < 0 else e for e in entries]
    if not at or any(not 0 <= e < size for e in at):
        return None
    return at[0] if at == list(range(at[0], at[0] + len(at))) else None


@register(aten.select)
def _select(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    dim = args[1] % x.ndim
    if not _is_free(an, x.axes[dim]) and not x.const and dim + 1 < x.ndim:
        # one entry of the leading factor of a product viewed just before (BLOOM's
        # fused projection viewed as (heads, 3, head_dim), its query taken by index 0):
        # a block of that product, with a head dimension of its own
        index = args[2] % axis_size(x, dim)
        block = _product_block(an, x, dim, index, 1)
        if block is not None:
            keep = [i for i in range(x.ndim) if i != dim]
            return Value([list(block.axes[i]) for i in keep], [block.src[i] for i in keep])
    if not _is_free(an, x.axes[dim]):
        an.pin([Value([x.axes[dim]])], f"select {node.name!r} picks a feature", notable=not x.const)
    keep = [i for i in range(x.ndim) if i != dim]
    return Value([list(x.axes[i]) for i in keep], [x.src[i] for i in keep], False, x.const)


@register(aten.index, aten.index_select)
def _index(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    shape = out_shapes(node)
    if "index_select" in str(node.target):
        dim = args[1] % x.ndim
        if not _is_free(an, x.axes[dim]):
            an.pin(
                [Value([x.axes[dim]])], f"{node.name!r} indexes a feature axis", notable=not x.const
            )
        out = copy_value(x, keep_src=False)
        out.axes[dim] = [an.lattice.fresh(shape[dim], Level.FREE, "indexed")]
        return out
    indices = list(args[1])
    k = len(indices)
    given = [i for i, idx in enumerate(indices) if idx is not None]
    if len(given) == 1 and len(out_shapes(node)) == x.ndim:
        # one constant list of consecutive entries along one axis: a slice of that axis
        dim = given[0]
        index_nodes = node.args[1]
        assert isinstance(index_nodes, list | tuple)
        entries = _index_list(an, index_nodes[dim])
        start = None if entries is None else _as_range(entries, axis_size(x, dim))
        if start is not None:
            return _take(an, node, x, dim, start, 1, f"{node.name!r} indexes a feature axis")
    leading = all(i is not None for i in indices)
    for i, idx in enumerate(indices):
        if idx is not None and not _is_free(an, x.axes[i]):
            # rows of a parameter looked up by index are pinned, as an embedding's are
            notable = not x.const and not x.src[i]
            an.pin([Value([x.axes[i]])], f"{node.name!r} indexes a feature axis", notable=notable)
    if not leading:
        an.pin([x], f"{node.name!r}: advanced indexing not understood", notable=not x.const)
        return an.free(shape, "indexed")
    n_index = len(shape) - (x.ndim - k)
    axes = [[an.lattice.fresh(s, Level.FREE, "indexed")] for s in shape[:n_index]]
    axes += [list(a) for a in x.axes[k:]]
    # the axes after the indexed ones are views of the same parameter axes (the heads
    # of a relative position table whose rows a constant index looks up)
    src = [frozenset[tuple[str, int]]() for _ in range(n_index)] + list(x.src[k:])
    return Value(axes, src, const=x.const)


def _reassembled(an: Analysis, parts: Sequence[Value], dim: int) -> Var | None:
    """The variable whose blocks ``parts`` are along ``dim``, in order and all of them
    (a head's rotary and pass-through dimensions glued back), else None."""
    if any(len(p.axes[dim]) != 1 for p in parts):
        return None
    pieces = [an.lattice.find(p.axes[dim][0]) for p in parts]
    whole = pieces[0].whole
    if whole is None:
        return None
    blocks = an.lattice.pieces(whole)
    if blocks is not None and [an.lattice.find(v) for _, v in blocks] == pieces:
        return an.lattice.find(whole)
    return None


@register(aten.cat)
def _cat(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    dim = (args[1] if len(args) > 1 else kw.get("dim", 0)) % len(out_shapes(node))
    # an empty part adds nothing (the pass-through dims of a head whose dims all rotate)
    parts = [p for p in args[0] if isinstance(p, Value) and axis_size(p, dim) > 0]
    shape = out_shapes(node)
    if len(parts) == 1:
        return copy_value(parts[0], keep_src=False)
    strided = deinterleaved(an, node, dim)
    if strided is not None:
        return strided
    # a part de-interleaved above holds its features re-ordered: glued back, the parts
    # are not their variable in its order
    glued = node.args[0] if isinstance(node.args[0], list | tuple) else []
    reordered = any(
        isinstance(p, Node) and op_name(p) == "cat" and deinterleaved(an, p, dim) is not None
        for p in glued
    )
    whole = _reassembled(an, parts, dim) if len(parts) > 1 and not reordered else None
    if whole is not None:
        glued = [list(a) for a in parts[0].axes]
        glued[dim] = [whole]
        for i in range(len(shape)):
            if i != dim:
                for p in parts[1:]:
                    an.unify(parts[0].axes[i], p.axes[i], f"cat {node.name!r}")
        return Value(glued, const=all(p.const for p in parts))
    # along a feature axis: the direct sum of the parts' spaces (the class token beside
    # the mean of the patches: two copies of the stream, each block moved alike)
    summed = an.lattice.join([p.axes[dim] for p in parts], f"cat {node.name!r}")
    axes: list[list[Var]] = []
    for i in range(len(shape)):
        if i == dim:
            axes.append([summed or an.lattice.fresh(shape[i], Level.FREE, "concatenated")])
            continue
        full = [p for p in parts if axis_size(p, i) > 1]
        for p in full[1:]:
            an.unify(full[0].axes[i], p.axes[i], f"cat {node.name!r}")
        for p in full:
            an.mark(p, i, "write")  # a parameter concatenated into a stream writes it
        axes.append(list(full[0].axes[i]) if full else [])
    return Value(axes, const=all(p.const for p in parts))


@register(aten.stack)
def _stack(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    parts = [p for p in args[0] if isinstance(p, Value)]
    shape = out_shapes(node)
    dim = (args[1] if len(args) > 1 else 0) % len(shape)
    for p in parts[1:]:
        for i in range(p.ndim):
            an.unify(parts[0].axes[i], p.axes[i], f"stack {node.name!r}")
    axes = [list(a) for a in parts[0].axes]
    axes.insert(dim, [an.lattice.fresh(shape[dim], Level.FREE, "stacked")])
    return Value(axes, const=all(p.const for p in parts))


def _blocks(an: Analysis, x: Value, dim: int, sizes: Sequence[int]) -> list[Value] | None:
    """The chunks of one feature variable as variables of their own (a direct sum: a
    fused projection's query, key and value blocks each keep their own basis), or None
    when the axis is not one variable that can be cut there."""
    leaves = an.lattice.leaves(x.axes[dim])
    if len(leaves) != 1:
        return None
    out, start = [], 0
    for size in sizes:
        piece = an.lattice.cut(leaves[0], start, size)
        if piece is None:
            return None
        value = copy_value(x, keep_src=False)
        value.axes[dim] = [piece]
        out.append(value)
        start += size
    for cut in range(1, len(sizes)):
        an.cuts.append((leaves[0], sum(sizes[:cut])))
    return out


def _unbound_blocks(an: Analysis, x: Value, dim: int) -> list[Value] | None:
    """Every entry of the leading factor of a product viewed just before, each a block of
    that product with a head dimension of its own (ModernBERT's fused projection viewed as
    ``(3, heads, head_dim)`` and unbound into query, key and value): the direct sum of
    equal blocks, as :func:`_select` takes one of them; None when ``dim`` is not such a
    factor."""
    keep = [i for i in range(x.ndim) if i != dim]
    out = []
    for index in range(axis_size(x, dim)):
        block = _product_block(an, x, dim, index, 1)
        if block is None:
            return None
        out.append(Value([list(block.axes[i]) for i in keep], [block.src[i] for i in keep]))
    return out


@register(*_ops("split", "split_with_sizes", "chunk", "unbind", "unsafe_split", "tensor_split"))
def _split(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    shapes = out_shapes(node)
    unbind = "unbind" in str(node.target)
    dim = kw.get("dim", args[1] if unbind and len(args) > 1 else args[2] if len(args) > 2 else 0)
    dim %= x.ndim
    sizes = [1 if unbind else s[dim] for s in shapes]
    if _is_free(an, x.axes[dim]):
        pieces = []
        for s in shapes:
            piece = copy_value(x, keep_src=False)
            if unbind:
                del piece.axes[dim], piece.src[dim]
            else:
                piece.axes[dim] = [an.lattice.fresh(s[dim], Level.FREE, "split")]
            pieces.append(piece)
        return pieces
    if unbind and not x.const:
        entries = _unbound_blocks(an, x, dim)
        if entries is not None:
            return entries
    blocks = None if unbind or x.const else _blocks(an, x, dim, sizes)
    if blocks is not None:
        return blocks
    if len(set(sizes)) != 1 or unbind:
        an.pin(
            [Value([x.axes[dim]])],
            f"{node.name!r} splits a feature axis unevenly",
            notable=not x.const,
        )
        return [an.free(s, "split") for s in shapes]
    # equal chunks of a feature axis: [chunks (pinned), unit] -- every chunk shares the unit
    unit = an.lattice.fresh(sizes[0], Level.ORTH)
    chunks = an.lattice.fresh(len(sizes), Level.FREE, "chunk index")
    an.unify(x.axes[dim], [chunks, unit], f"split {node.name!r}")
    out = []
    for _ in sizes:
        piece = copy_value(x, keep_src=False)
        piece.axes[dim] = [unit]
        out.append(piece)
    return out
