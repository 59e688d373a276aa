"""Attention heads read off the graph: which projections make each attention's query,
key and value, which layer reads its output, and so the heads' QK/OV circuits.

From each operand of a scaled-dot-product attention the graph is walked back to the
projection that made it, through views, casts, broadcasts (grouped-query key/value
heads), scalings by constants, norms of the queries and keys (a scale per row and a
weight per feature: the circuits then leave the norm out, which mixes no features;
they tell heads apart, they are not the exact score), and rotary position embeddings
(``x cos + rot(x) sin``: a sum whose one term reaches the projection whole, the other
through slices of the head dimension). An operand that reaches a projection only through
slices (a block of a fused projection cut out by offsets, or the rotary part of
partially rotary heads) has no circuit here: its rows are not a block of one weight
that this walk can name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.fx import Node

from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._graph import TRANSPARENT, op_name
from lmckit.symmetry._transform import CircuitPart, HeadCircuits

__all__ = ["head_circuits"]

#: ops an operand may pass through on its way back to its projection
_PASS = TRANSPARENT | {"expand", "repeat_interleave", "neg", "positive", "type_as"}
_SCALE = {"mul", "div"}
_SUM = {"add", "sub"}
_SPLITS = {"split", "split_with_sizes", "chunk"}
#: ops that keep a value's row-major order (a view of a projection's output features)
_ROW_MAJOR = {"view", "reshape", "_unsafe_view", "contiguous", "clone", "alias", "to",
              "_to_copy", "dropout", "detach", "unsqueeze", "squeeze", "flatten"}  # fmt: skip


@dataclass(frozen=True)
class _Source:
    """A projection an operand comes from: its node, the block of its output features
    (equal split or chunk), and whether the path cut through a slice."""

    node: Node
    block: int
    blocks: int
    sliced: bool
    #: rows ``[start, start + rows)`` of the projection's output (a slice by offsets)
    start: int = 0
    rows: int | None = None
    #: the blocks lie inside each head (a split after a view into heads: GPT-NeoX)
    per_head: bool = False


def _is_constant(an: Analysis, arg: object) -> bool:
    value = an.values.get(arg.name) if isinstance(arg, Node) else None
    return not isinstance(arg, Node) or getattr(value, "const", False)


def _scales(an: Analysis, arg: Node, node: Node) -> bool:
    """Whether ``arg`` only scales the features of the product ``node``: one number per
    row (a norm's ``1 / rms(x)``, size one along the features) or a parameter vector (a
    norm's weight). A norm of the queries and keys (qk-norm) mixes no features, so the
    heads are still told apart by the circuits of their projections."""
    shape = getattr(arg.meta.get("val"), "shape", None)
    out = getattr(node.meta.get("val"), "shape", None)
    if shape is None or out is None or not len(shape) or not len(out):
        return False
    if shape[-1] == 1 and out[-1] > 1:
        return True
    value = an.values.get(arg.name)
    return len(shape) == 1 and isinstance(value, Value) and any(value.src)


def _sources(an: Analysis, node: Node, sliced: bool = False, depth: int = 0) -> set[_Source]:
    """The projections ``node``'s value is made from (see the module docstring)."""
    if depth > 64:
        return set()
    op = op_name(node)
    if op in ("linear", "addmm"):
        return {_Source(node, 0, 1, sliced)}
    if op == "getitem":
        return _entry_sources(an, node, sliced, depth)
    tensors = [a for a in node.args if isinstance(a, Node)]
    if op in _PASS or op in _SPLITS:
        nexts = tensors[:1]
    elif op in _SCALE:
        nexts = [a for a in tensors if not _is_constant(an, a) and not _scales(an, a, node)]
        if len(nexts) != 1:
            return set()
    elif op in _SUM:
        nexts = [a for a in tensors if not _is_constant(an, a)]
    elif op == "slice" and (block := _row_block(node)) is not None:
        return {_Source(tensors[0], 0, 1, sliced, *block)}
    elif op in ("slice", "select"):
        nexts, sliced = tensors[:1], True
    elif op == "cat":
        parts = node.args[0] if isinstance(node.args[0], list | tuple) else []
        # an empty part adds nothing (rotary embeddings with no pass-through dims)
        nexts = [a for a in parts if isinstance(a, Node) and a.meta["val"].numel() > 0]
        whole = _glued(nexts)
        if whole is not None:  # a head's rotary and pass-through dims glued back
            nexts = [whole]
        sliced = sliced or len(nexts) > 1
    else:
        return set()
    out: set[_Source] = set()
    for arg in nexts:
        out |= _sources(an, arg, sliced, depth + 1)
    return out


def _entry_sources(an: Analysis, node: Node, sliced: bool, depth: int) -> set[_Source]:
    """The projections entry ``node`` of a split, chunk or unbind is a block of."""
    parent, index = node.args[0], node.args[1]
    if not isinstance(parent, Node) or op_name(parent) not in _SPLITS | {"unbind"}:
        return set()
    if not isinstance(index, int):
        return set()
    blocks = len(parent.meta["val"])
    source = parent.args[0]
    if not isinstance(source, Node):
        return set()
    found = _sources(an, source, sliced, depth + 1)
    # the split cuts the projection's whole output features (GPT-2's c_attn), or,
    # after a view into heads (GPT-NeoX), each head's features alike
    width = int(source.meta["val"].shape[-1])
    if op_name(parent) == "unbind":
        # entries of a view of the projection (ModernBERT's (3, heads, head_dim)), read
        # through no transpose: the unbound axis and those after it are its features
        width = _unbound_width(parent)
        found = {s for s in found if s.node is _viewed_projection(source)}
    sizes = [int(p.shape[-1]) for p in parent.meta["val"]]
    # blocks of unequal size (multi-head latent attention's [nope | rope] rows of each
    # head): rows by offsets
    span = (sum(sizes[:index]), sizes[index]) if len(set(sizes)) > 1 else None
    blocked = set()
    for s in found:
        total = int(s.node.meta["val"].shape[-1])
        if s.blocks != 1 or s.rows is not None or total % width:
            continue
        if span is None or op_name(parent) == "unbind":
            blocked.add(_Source(s.node, index, blocks, s.sliced, per_head=total != width))
        else:
            blocked.add(_Source(s.node, 0, 1, s.sliced, *span, per_head=total != width))
    return blocked


def _unbound_width(unbind: Node) -> int:
    """The features an ``unbind`` cuts into its entries: the product of the unbound axis
    and the axes after it (``3 * heads * head_dim`` for a projection viewed as
    ``(3, heads, head_dim)`` and unbound along the 3)."""
    shape = unbind.args[0].meta["val"].shape  # type: ignore[union-attr]
    dim = unbind.args[1] if len(unbind.args) > 1 else unbind.kwargs.get("dim", 0)
    assert isinstance(dim, int)
    return math.prod(int(s) for s in shape[dim % len(shape) :])


def _viewed_projection(node: Node) -> Node | None:
    """The projection ``node`` is a row-major view of (reshapes, casts and copies only,
    no transpose), else None: then trailing axes whose product divides the projection's
    width are its features' own blocks."""
    for _ in range(16):
        if op_name(node) in ("linear", "addmm"):
            return node
        if op_name(node) not in _ROW_MAJOR or not isinstance(node.args[0], Node):
            return None
        node = node.args[0]
    return None


def _slice_range(node: Node, size: int) -> tuple[int, int, int] | None:
    """``(dim, start, stop)`` of slice ``node`` over an axis of ``size`` entries (negative
    and open ends resolved), or None for a strided slice."""
    given = [a if isinstance(a, int) else None for a in node.args[1:5]]
    dim, begin, end, step = given + [None] * (4 - len(given))
    if step not in (None, 1):
        return None
    start = 0 if begin is None else (begin + size if begin < 0 else begin)
    stop = size if end is None else min(size, end + size if end < 0 else end)
    return dim or 0, start, stop


def _slice_behind(node: Node) -> Node | None:
    """The nearest slice ``node`` is computed from, through ops of one operand and sums
    or scalings (a rotary embedding), or None."""
    for _ in range(16):
        if op_name(node) == "slice":
            return node
        tensors = [a for a in node.args if isinstance(a, Node)]
        if not tensors:
            return None
        node = tensors[0]
    return None


def _glued(parts: list[Node]) -> Node | None:
    """The tensor whose consecutive slices along the last axis ``parts`` come from, in
    order and covering it, else None."""
    if len(parts) < 2:
        return None
    slices = [_slice_behind(p) for p in parts]
    if any(s is None for s in slices):
        return None
    sources = {s.args[0] for s in slices if s is not None}
    if len(sources) != 1:
        return None
    (source,) = sources
    if not isinstance(source, Node):
        return None
    width, ndim = int(source.meta["val"].shape[-1]), source.meta["val"].ndim
    at = 0
    for piece in slices:
        assert piece is not None
        found = _slice_range(piece, width)
        if found is None or found[0] % ndim != ndim - 1 or found[1] != at:
            return None
        at = found[2]
    return source if at == width else None


def _row_block(node: Node) -> tuple[int, int] | None:
    """``(start, rows)`` when slice ``node`` cuts a block of output features straight out
    of a projection (Phi-3's ``qkv[..., :q]``), else None."""
    source = node.args[0]
    if not isinstance(source, Node) or op_name(source) not in ("linear", "addmm"):
        return None
    ndim = source.meta["val"].ndim
    found = _slice_range(node, int(source.meta["val"].shape[-1]))
    if found is None or found[0] % ndim != ndim - 1:
        return None
    _, start, stop = found
    return (start, stop - start) if 0 <= start < stop else None


def _projection(an: Analysis, node: Node) -> _Source | None:
    """The one projection ``node`` comes from whole, if there is exactly one."""
    whole = {s for s in _sources(an, node) if not s.sliced}
    return whole.pop() if len(whole) == 1 else None


def _forward_to_linear(node: Node) -> Node | None:
    while len(node.users) == 1:
        (node,) = node.users
        if op_name(node) in ("linear", "addmm"):
            return node
        if op_name(node) not in TRANSPARENT:
            return None
    return None


def _weight_and_bias(node: Node) -> tuple[object, object, bool]:
    """A projection's weight and bias nodes, and whether the weight is ``(in, out)``
    (``addmm(bias, x, W)``, Hugging Face's ``Conv1D``)."""
    if op_name(node) == "addmm":
        return node.args[2], node.args[0], True
    return node.args[1], (node.args[2] if len(node.args) > 2 else None), False


def _rows(source: _Source, operand: Node, total: int) -> int:
    """How many rows of its projection's ``total`` hold ``operand`` (rows by offsets
    inside each head: so many per head, of as many heads as the operand has)."""
    if source.rows is not None and source.per_head:
        shape = operand.meta["val"].shape
        return source.rows * (int(shape[-3]) if len(shape) == 4 else 1)
    return source.rows or total // source.blocks


def _pieces(node: Node) -> dict[tuple[int, int], Node]:
    """``node``'s value as pieces along its last (feature) axis: ``(start, width)`` ->
    the node each comes from. A concatenation gives its parts; a tensor made empty and
    filled slice by slice (``new_empty``, then ``copy_`` into slices of it: DeepSeek's
    keys) what is copied into each; anything else is one piece."""
    value = node.meta["val"]
    width, ndim = int(value.shape[-1]), value.ndim
    parts = node.args[0]
    if op_name(node) == "cat" and node.args[-1] in (-1, ndim - 1) and isinstance(parts, list):
        out, at = {}, 0
        for part in parts:
            if not isinstance(part, Node):
                return {(0, width): node}
            size = int(part.meta["val"].shape[-1])
            out[(at, size)] = part
            at += size
        return out
    if op_name(node) == "new_empty":
        out = {}
        for cut in (u for u in node.users if op_name(u) == "slice"):
            found = _slice_range(cut, width)
            copies = [u for u in cut.users if op_name(u) == "copy_" and u.args[0] is cut]
            if found is None or found[0] % ndim != ndim - 1 or len(copies) != 1:
                return {(0, width): node}
            source = copies[0].args[1]
            if isinstance(source, Node):
                out[(found[1], found[2] - found[1])] = source
        return out or {(0, width): node}
    return {(0, width): node}


def _scored(an: Analysis, query: Node, key: Node) -> tuple[Node, Node]:
    """The query and key whose product the circuits read: the operands themselves, or,
    when neither comes from one projection whole (multi-head latent attention glues
    each head's position-free features to rotary ones shared by every head), the first
    pieces at the same features of both that do. Like a qk-norm, the rest of the score
    is left out: the circuits tell heads apart, they are not the exact score."""
    if _projection(an, query) is not None and _projection(an, key) is not None:
        return query, key
    queries, keys = _pieces(query), _pieces(key)
    for at, piece in sorted(queries.items(), key=lambda item: item[0]):
        other = keys.get(at)
        if other is None:
            continue
        if _projection(an, piece) is not None and _projection(an, other) is not None:
            return piece, other
    return query, key


def head_circuits(an: Analysis) -> dict[str, HeadCircuits]:
    """Query weight key -> the head circuits of every attention computed by projections."""
    nodes = {n.name: n for n in an.traced.graph.nodes}
    params = an.traced.params
    out: dict[str, HeadCircuits] = {}
    for site in an.attention:
        query, keys = _scored(an, nodes[site.query], nodes[site.key])
        operands = (query, keys, nodes[site.value])
        found = [_projection(an, node) for node in operands]
        output = _forward_to_linear(nodes[site.node])
        if any(f is None for f in found) or output is None:
            continue
        parts: list[CircuitPart] = []
        biases: list[CircuitPart | None] = []
        rows: list[int] = []
        for source, operand in zip((f for f in found if f is not None), operands, strict=True):
            weight, bias, transposed = _weight_and_bias(source.node)
            if not isinstance(weight, Node) or weight.name not in params:
                break
            key = params[weight.name]
            span = (source.start, source.rows, source.per_head)
            parts.append(CircuitPart(key, source.block, source.blocks, transposed, *span))
            shape = an.traced.shapes[key]
            rows.append(_rows(source, operand, shape[1 if transposed else 0]))
            if isinstance(bias, Node) and bias.name in params:
                biases.append(
                    CircuitPart(params[bias.name], source.block, source.blocks, False, *span)
                )
            else:
                biases.append(None)
        out_weight, _, out_transposed = _weight_and_bias(output)
        if len(parts) != 3 or not isinstance(out_weight, Node) or out_weight.name not in params:
            continue
        head_dim = int(query.meta["val"].shape[-1])
        # heads merged into the batch axis (DeBERTa's (batch * heads, time, dim)): the
        # query projection's rows say how many
        queries = nodes[site.query].meta["val"]
        heads = int(queries.shape[-3]) if queries.dim() == 4 else rows[0] // head_dim
        if rows[0] != heads * head_dim or rows[1] % head_dim:
            continue  # projections that are not whole heads of this attention
        if rows[2] % (rows[1] // head_dim):
            continue  # values that are not whole heads either
        out[parts[0].param] = HeadCircuits(
            parts[0],
            parts[1],
            parts[2],
            params[out_weight.name],
            query_bias=biases[0],
            key_bias=biases[1],
            value_bias=biases[2],
            heads=heads,
            kv_heads=rows[1] // head_dim,
            output_transposed=out_transposed,
        )
    return out
