"""An interleaved rotary embedding written on the even and odd dims and glued back
de-interleaved (DeepSeek's ``cat([x0 cos - x1 sin, x1 cos + x0 sin])`` with
``x0, x1 = x[..., 0::2], x[..., 1::2]``): its output holds ``x``'s features re-ordered
plane by plane, so the rules read it as ``x`` (the strided slices pin ``x``; which maps of
its planes keep the function, the check decides: the rotary query/key basis)."""

from __future__ import annotations

from torch.fx import Node

from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._graph import op_name
from lmckit.inference._rules import copy_value, out_shapes

__all__ = ["deinterleaved"]

#: ops through which a part of an interleaved rotary embedding reaches its slices
_COMBINING = ("mul", "sub", "add", "neg", "div")


def _strided_slices(an: Analysis, node: Node, dim: int) -> set[tuple[Node, int, int]] | None:
    """The strided slices ``(source, start, step)`` along ``dim`` that ``node`` is made
    of by sums and products with constants (``x[..., 0::2] * cos - x[..., 1::2] * sin``),
    else None."""
    if op_name(node) == "slice":
        given = [*node.args[1:5], None, None, None, None][:4]
        axis, start, _, step = (a if isinstance(a, int) else None for a in given)
        source, ndim = node.args[0], len(out_shapes(node))
        if not isinstance(source, Node) or step is None or step < 2:
            return None
        return {(source, start or 0, step)} if (axis or 0) % ndim == dim else None
    if op_name(node) not in _COMBINING:
        return None
    found: set[tuple[Node, int, int]] = set()
    for arg in node.args:
        value = an.values.get(arg.name) if isinstance(arg, Node) else None
        if not isinstance(arg, Node) or not isinstance(value, Value) or value.const:
            continue
        inner = _strided_slices(an, arg, dim)
        if inner is None:
            return None
        found |= inner
    return found or None


def deinterleaved(an: Analysis, node: Node, dim: int) -> Value | None:
    """``x`` itself when ``node`` glues, along ``dim``, parts made by sums and products
    with constants of the strided slices ``x[..., k::step]`` that together take every
    entry of ``x`` once (an interleaved rotary embedding written on the even and odd
    dims, DeepSeek's: ``cat([x0 cos - x1 sin, x1 cos + x0 sin])``). Its features are
    ``x``'s, re-ordered plane by plane: the slices already pinned them, so which maps of
    them keep the function is left to the check (the rotary query/key basis)."""
    parts = node.args[0]
    slices: set[tuple[Node, int, int]] = set()
    for part in parts if isinstance(parts, list | tuple) else []:
        found = _strided_slices(an, part, dim) if isinstance(part, Node) else None
        if found is None:
            return None
        slices |= found
    sources = {source for source, _, _ in slices}
    steps = {step for _, _, step in slices}
    if len(sources) != 1 or len(steps) != 1:
        return None
    (source,), (step,) = sources, steps
    x = an.values.get(source.name)
    if not isinstance(x, Value) or out_shapes(source) != out_shapes(node):
        return None
    if sorted(start for _, start, _ in slices) != list(range(step)):
        return None
    for cut in (u for u in source.users if op_name(u) == "slice"):
        # understood: the planes of a rotary embedding, whose basis the check decides
        reason = f"slice {cut.name!r} cuts a feature axis"
        if reason in an.notes:
            an.notes.remove(reason)
    return copy_value(x, keep_src=False)
