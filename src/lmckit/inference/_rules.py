"""Op rules, part 1: the registry, and how shape and elementwise ops move feature axes.

A rule takes the :class:`~lmckit.inference._analysis.Analysis`, the graph node and its
arguments (abstract :class:`~lmckit.inference._analysis.Value` for tensors, Python objects
otherwise) and returns the node's abstract value, constraining variables on the way.
Rules are keyed by ATen op packet (``torch.ops.aten.linear``), so every overload of an
op shares one rule; the table is data, and an op without a rule is handled
conservatively by :func:`unknown_op` (everything it touches is pinned and reported).
Slicing and joining ops are in :mod:`lmckit.inference._slicing`, elementwise ops in
:mod:`lmckit.inference._elementwise`, layer-like ops (linear, convolution, attention, norms) in
:mod:`lmckit.inference._layers`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import Node

from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._lattice import Level, Var

__all__ = [
    "NAMED_RULES",
    "RULES",
    "axis_size",
    "copy_value",
    "out_shapes",
    "register",
    "register_named",
    "unknown_op",
]

aten = torch.ops.aten
Rule = Callable[[Analysis, Node, tuple[Any, ...], dict[str, Any]], Any]
RULES: dict[Any, Rule] = {}
#: rules of ops that other libraries register (their packets may not exist yet when
#: lmckit is imported), by the op's name
NAMED_RULES: dict[str, Rule] = {}
#: rules under which an elementwise square keeps its meaning (see Value.square)
SQUARE_SAFE: set[Any] = set()


def register(*ops: Any, square_safe: bool = False) -> Callable[[Rule], Rule]:
    """Decorator: ``fn`` is the rule of every op packet in ``ops``."""

    def deco(fn: Rule) -> Rule:
        for op in ops:
            if op is None:
                continue
            RULES[op] = fn
            if square_safe:
                SQUARE_SAFE.add(op)
        return fn

    return deco


def register_named(*names: str) -> Callable[[Rule], Rule]:
    """Decorator: ``fn`` is the rule of the ops called ``names`` in any namespace."""

    def deco(fn: Rule) -> Rule:
        for name in names:
            NAMED_RULES[name] = fn
        return fn

    return deco


def _ops(*names: str) -> list[Any]:
    """ATen op packets by name; names missing from this torch build are skipped."""
    return [getattr(aten, n) for n in names if hasattr(aten, n)]


def out_shapes(node: Node) -> Any:
    """The node's output shape (a tuple), or a list/tuple of shapes for multiple outputs."""

    def shape(val: Any) -> Any:
        if isinstance(val, torch.Tensor):
            return tuple(int(s) for s in val.shape)
        if isinstance(val, list | tuple):
            return type(val)(shape(v) for v in val)
        return None

    return shape(node.meta.get("val"))


def axis_size(value: Value, axis: int) -> int:
    return math.prod(v.size for v in value.axes[axis])


def copy_value(value: Value, *, keep_src: bool = True) -> Value:
    """A new value with the same factors (and, unless told, the same provenance)."""
    src = list(value.src) if keep_src else []
    return Value([list(a) for a in value.axes], src, value.square, value.const)


def _tensors(args: Any) -> list[Value]:
    out: list[Value] = []
    for arg in args if isinstance(args, list | tuple) else [args]:
        if isinstance(arg, Value):
            out.append(arg)
        elif isinstance(arg, list | tuple):
            out += _tensors(arg)
    return out


def _fresh_outputs(an: Analysis, node: Node, reason: str) -> Any:
    shapes = out_shapes(node)

    def build(s: Any) -> Any:
        if isinstance(s, tuple) and all(isinstance(d, int) for d in s):
            return an.free(s, reason)
        if isinstance(s, list | tuple):
            return type(s)(build(x) for x in s)
        return None

    return build(shapes)


def unknown_op(an: Analysis, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Conservative rule: pin every feature axis the op touches; outputs are pinned too."""
    inputs = _tensors(list(args) + list(kwargs.values()))
    op = str(node.target)
    an.pin(inputs, f"{op} (node {node.name!r}) is not understood", notable=True)
    return _fresh_outputs(an, node, f"output of {op}")


# --------------------------------------------------------------------------- identity


@register(
    *_ops("alias", "detach", "clone", "contiguous", "to", "_to_copy", "lift_fresh_copy"),
    *_ops("dropout", "feature_dropout", "alpha_dropout", "type_as", "_assert_tensor_metadata"),
    operator.getitem,
    square_safe=True,
)
def _identity(an: Analysis, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if node.target is operator.getitem:
        seq, index = args
        return seq[index] if seq is not None else None
    if str(node.target).startswith("aten._assert"):
        return None
    x = args[0]
    return copy_value(x) if isinstance(x, Value) else _fresh_outputs(an, node, "constant")


@register(aten.native_dropout)
def _native_dropout(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    shapes = out_shapes(node)
    return (copy_value(args[0]), an.free(shapes[1], "dropout mask"))


# --------------------------------------------------------------------------- axes


@register(*_ops("transpose", "swapaxes", "t", "numpy_T", "permute", "movedim", "adjoint"))
def _permute_axes(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    n = x.ndim
    name = node.target.__name__.split(".")[0] if hasattr(node.target, "__name__") else ""
    order = list(range(n))
    if name in ("transpose", "swapaxes"):
        a, b = args[1] % n, args[2] % n
        order[a], order[b] = order[b], order[a]
    elif name in ("t", "numpy_T", "adjoint") and n >= 2:
        order = order[::-1] if name == "numpy_T" else [*order[:-2], n - 1, n - 2]
    elif name == "permute":
        order = [d % n for d in args[1]]
    elif name == "movedim":
        src = [args[1]] if isinstance(args[1], int) else list(args[1])
        dst = [args[2]] if isinstance(args[2], int) else list(args[2])
        rest = [d for d in range(n) if d not in [s % n for s in src]]
        order = [-1] * n
        for s, d in zip(src, dst, strict=True):
            order[d % n] = s % n
        it = iter(rest)
        order = [o if o >= 0 else next(it) for o in order]
    return Value([list(x.axes[i]) for i in order], [x.src[i] for i in order], x.square, x.const)


@register(aten.unsqueeze, square_safe=True)
def _unsqueeze(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    dim = args[1] % (x.ndim + 1)
    axes, src = [list(a) for a in x.axes], list(x.src)
    axes.insert(dim, [])
    src.insert(dim, frozenset())
    return Value(axes, src, x.square, x.const)


@register(aten.squeeze, square_safe=True)
def _squeeze(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    dims = args[1] if len(args) > 1 else None
    if dims is None:
        drop = {i for i in range(x.ndim) if axis_size(x, i) == 1}
    else:
        dims = [dims] if isinstance(dims, int) else dims
        drop = {d % x.ndim for d in dims if axis_size(x, d % x.ndim) == 1}
    keep = [i for i in range(x.ndim) if i not in drop]
    return Value([list(x.axes[i]) for i in keep], [x.src[i] for i in keep], x.square, x.const)


@register(*_ops("view", "reshape", "_unsafe_view", "view_as", "flatten", "unflatten"))
def _reshape(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    shape = out_shapes(node)
    return reshape(an, x, shape, f"reshape {node.name!r}")


def reshape(an: Analysis, x: Value, shape: Sequence[int], reason: str) -> Value:
    """The value ``x`` viewed with ``shape``: factors regrouped, split where needed.

    An input axis that reappears unchanged keeps its parameter provenance.
    """
    pending = list(an.lattice.leaves(x.factors()))[::-1]
    axes: list[list[Var]] = []
    for size in shape:
        axis: list[Var] = []
        need = size
        while need > 1:
            if not pending:
                break
            var = an.lattice.find(pending.pop())
            if var.parts is not None:
                pending.extend(an.lattice.leaves(var.parts)[::-1])
                continue
            if var.size <= need and need % var.size == 0:
                axis.append(var)
                need //= var.size
            elif var.size % need == 0:
                head, tail = an.lattice.split(var, [need, var.size // need])
                axis.append(head)
                pending.append(tail)
                need = 1
            else:
                # the new axis cuts across a factor: no product structure survives
                merged = [var, *pending[::-1]]
                an.lattice.pin(merged, f"{reason}: axes merged across features")
                return an.free(shape, reason) if not x.const else _const(an, shape)
        axes.append(axis)
    src: list[frozenset[tuple[str, int]]] = []
    by_factors = {tuple(id(v) for v in a): s for a, s in zip(x.axes, x.src, strict=True)}
    for axis in axes:
        src.append(by_factors.get(tuple(id(v) for v in axis), frozenset()) if axis else frozenset())
    return Value(axes, src, x.square, x.const)


def _const(an: Analysis, shape: Sequence[int]) -> Value:
    value = an.free(shape, "constant")
    value.const = True
    return value


@register(aten.expand, aten.expand_as)
def _expand(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    shape = out_shapes(node)
    lead = len(shape) - x.ndim
    axes: list[list[Var]] = []
    src: list[frozenset[tuple[str, int]]] = []
    for i, size in enumerate(shape):
        j = i - lead
        if j >= 0 and axis_size(x, j) == size:
            axes.append(list(x.axes[j]))
            src.append(x.src[j])
        else:  # a broadcast copy: equal values along it, kept by any permutation
            axes.append([an.lattice.fresh(size, Level.PERM, "broadcast copy")])
            src.append(frozenset())
    return Value(axes, src, False, x.const)


@register(aten.repeat, aten.repeat_interleave)
def _repeat(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x = args[0]
    shape = out_shapes(node)
    if not isinstance(x, Value):
        return _const(an, shape)
    interleave = "interleave" in str(node.target)
    if interleave:
        dim = kw.get("dim", args[2] if len(args) > 2 else None)
        if dim is None or not isinstance(args[1], int):
            an.pin([x], f"{node.target} without a dim", notable=True)
            return an.free(shape, "repeat")
        dim %= x.ndim
        axes = [list(a) for a in x.axes]
        axes[dim] = [*axes[dim], an.lattice.fresh(args[1], Level.FREE, "copies")]
        return Value(axes, const=x.const)
    reps = list(args[1])
    lead = len(reps) - x.ndim
    axes = [[an.lattice.fresh(r, Level.FREE, "copies")] for r in reps[:lead]]
    for j, r in enumerate(reps[lead:]):
        copies = [an.lattice.fresh(r, Level.FREE, "copies")] if r > 1 else []
        axes.append([*copies, *x.axes[j]])
    return Value(axes, const=x.const)


# --------------------------------------------------------------------------- complex views


@register(*_ops("view_as_complex"))
def _view_as_complex(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    """Pairs of the last axis read as complex numbers (rotary embeddings written with
    complex multiplication): the pair's two entries are pinned, the other axes stay."""
    x: Value = args[0]
    an.lattice.pin(x.axes[-1], f"{node.name!r} reads pairs as complex numbers")
    return Value([list(a) for a in x.axes[:-1]], const=x.const)


@register(*_ops("view_as_real"))
def _view_as_real(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    pair = an.lattice.fresh(2, Level.FREE, "real and imaginary parts")
    return Value([*(list(a) for a in x.axes), [pair]], const=x.const)
