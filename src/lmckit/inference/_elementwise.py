"""Op rules, part 2: elementwise arithmetic, nonlinearities, reductions and constants.

What each kind of op allows a feature axis (see :class:`~lmckit.inference._lattice.Level`):

* sums of two covariant tensors, scalings by a number or by a per-row invariant
  (``x * rsqrt(mean(x^2))``), negation: every orthogonal map commutes with them;
* adding a number or a per-row value to every unit, a sum or mean over the axis: the
  orthogonal maps that fix the ones vector (``Q 1 = 1``), which include permutations;
  a sum of an elementwise square (``sum(x^2)``, a squared norm) keeps every orthogonal map;
* activations, products of two feature vectors, a parameter scaling each unit, ``max``,
  ``softmax``: permutations only;
* a constant that varies along the axis (positions, masks): nothing (pinned).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Node

from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._graph import TRANSPARENT, is_inplace, op_name
from lmckit.inference._lattice import Level, Var
from lmckit.inference._rules import _ops, axis_size, out_shapes, register

__all__ = ["scale_parameter"]

aten = torch.ops.aten


def _and_inplace(*names: str) -> list[Any]:
    """The ops ``names`` and their in-place forms (``add_``): to the analysis an in-place
    op is its functional form whose result the graph goes on using."""
    return _ops(*names, *(f"{n}_" for n in names))


_ADD = _and_inplace("add", "sub") + _ops("rsub")
_MUL = _and_inplace("mul", "div")
_SELECT = _and_inplace("maximum", "minimum", "fmax", "fmin", "where", "masked_fill", "lerp")
_SELECT += _ops("atan2", "polar", "complex")
_COMPARE = _ops("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not")
_COMPARE += _ops("logical_xor", "bitwise_and", "bitwise_or", "bitwise_not", "__and__", "__or__")
_NONLINEAR = _and_inplace(
    "relu", "relu6", "gelu", "silu", "mish", "tanh", "sigmoid", "elu", "selu", "celu",
    "leaky_relu", "hardtanh", "hardswish", "hardsigmoid", "softplus", "softsign", "exp",
    "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "erf",
    "erfc", "sin", "cos", "tan", "abs", "sign", "clamp", "clamp_min", "clamp_max", "floor",
    "ceil", "round", "trunc", "frac", "sgn", "logit", "nan_to_num", "threshold",
)  # fmt: skip
_CONSTANTS = _ops(
    "arange", "zeros", "ones", "full", "empty", "scalar_tensor", "rand", "randn", "randint",
    "new_ones", "new_zeros", "new_full", "new_empty", "zeros_like", "ones_like", "full_like",
    "empty_like", "rand_like", "randn_like", "eye", "linspace", "logspace", "tensor",
    "lift_fresh", "empty_strided", "new_empty_strided", "bernoulli",
)  # fmt: skip


#: ops through which a value is still "the same activation" (see _origin)
_POINTWISE = {*_ADD, *_MUL, *_NONLINEAR, aten.pow, aten.neg, *_ops("view", "reshape", "to")}
_POINTWISE |= set(_ops("_to_copy", "alias", "clone", "contiguous", "dropout", "transpose"))


def _aligned(values: list[Value], ndim: int, axis: int) -> list[tuple[Value, int]]:
    """Operands that are not broadcast along output axis ``axis`` (right-aligned)."""
    out = []
    for v in values:
        j = axis - (ndim - v.ndim)
        if j >= 0 and axis_size(v, j) > 1:
            out.append((v, j))
    return out


def _elementwise(an: Analysis, node: Node, args: tuple[Any, ...], kind: str) -> Value:
    """Broadcast ``args`` together; ``kind``: ``add``, ``mul`` or ``select``."""
    shape = out_shapes(node)
    tensors = [a for a in args if isinstance(a, Value)]
    numbers = [a for a in args if not isinstance(a, Value) and a is not None]
    square = False
    if kind == "mul" and len(tensors) == 2 and node.args[0] is node.args[1]:
        square = True  # x * x: an elementwise square (see Value.square)
    elif kind == "mul" and len(tensors) == 1:
        square = tensors[0].square
    what = f"{node.target} (node {node.name!r})"
    axes: list[list[Var]] = []
    src: list[frozenset[tuple[str, int]]] = []
    for i in range(len(shape)):
        full = _aligned(tensors, len(shape), i)
        if not full:
            axes.append([])
            src.append(frozenset())
            continue
        # tables of constants (positions, masks) constrain the activations they meet but
        # do not tie them together: the first operand that is not one carries the axis
        full.sort(key=lambda vj: vj[0].const)
        base, j0 = full[0]
        for v, j in full[1:]:
            if v.const and not base.const:
                an.lattice.constrain(base.axes[j0], v.axes[j], what)
            else:
                an.unify(base.axes[j0], v.axes[j], what)
        factors = list(base.axes[j0])
        if len(full) >= 2 and kind == "mul" and not square:
            # a product of two vectors along one axis acts unit by unit
            an.lattice.lower(factors, Level.PERM, f"{what} multiplies features elementwise")
            for v, j in full:
                an.mark(v, j, "elementwise")
            if all(not v.const for v, _ in full) and node.name not in an.products:
                an.products.append(node.name)  # a gate: its branches may trade scales
        elif len(full) >= 2 and kind == "add":
            for v, j in full:
                an.mark(v, j, "write")
            live = [a for a in node.args if isinstance(a, Node) and an.is_activation(a)]
            if len({_origin(a) for a in live}) >= 2:
                for leaf in an.lattice.leaves(factors):
                    leaf.residual = True  # outputs of two layers summed: a residual stream
        elif len(full) >= 2:
            an.lattice.lower(factors, Level.PERM, f"{what} selects unit by unit")
        elif kind == "add" and (len(tensors) >= 2 or numbers):
            # adding the same number to every unit: permutations keep it, rotations do not
            an.lattice.center(factors, f"{what} adds a constant to every unit")
        elif kind == "select":
            an.lattice.lower(factors, Level.PERM, f"{what} selects unit by unit")
        axes.append(factors)
        # a parameter scaled by, or shifted by, a number is still that parameter unit by
        # unit (Gemma's 1 + w), and so it is by a value broadcast along this axis (DINOv2's
        # mask token times the mask, one number per token): its axis keeps its
        # provenance, so its use is recorded
        keep = len(full) == 1 and kind in ("mul", "add")
        src.append(base.src[j0] if keep else frozenset())
    return Value(axes, src, square, all(t.const for t in tensors))


def _origin(node: Node) -> Node:
    """The op that produced ``node`` before pointwise functions of one tensor and views."""
    while True:
        tensors = [a for a in node.args if isinstance(a, Node)]
        packet = getattr(node.target, "overloadpacket", None)
        if len(tensors) != 1 or packet not in _POINTWISE:
            return node
        node = tensors[0]


@register(*_ADD)
def _add(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    return _elementwise(an, node, args, "add")


@register(*_MUL, square_safe=True)
def _mul(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    tensors = [a for a in args if isinstance(a, Value)]
    shape = out_shapes(node)
    full_both = any(len(_aligned(tensors, len(shape), i)) >= 2 for i in range(len(shape)))
    squares = [t for t in tensors if t.square]
    if squares and (full_both or "div" in str(node.target) and tensors[-1].square):
        an.lower(squares, f"{node.target} (node {node.name!r}) uses a square unit by unit")
    value = _elementwise(an, node, args, "mul")
    _record_scale(an, node, args)
    return value


def _record_scale(an: Analysis, node: Node, args: tuple[Any, ...]) -> None:
    """A parameter vector times a feature axis: a foldable scale (e.g. an RMSNorm's)."""
    from lmckit.inference._analysis import ScaleSite

    if "mul" not in str(node.target) or len(node.args) != 2:
        return
    for arg, other in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
        found = scale_parameter(an, arg) if isinstance(arg, Node) else None
        if found is None or not isinstance(other, Node):
            continue
        name, offset = found
        if an.values[name].ndim == 1:
            an.scales.append(ScaleSite(node.name, name, None, "scale", offset=offset))


def scale_parameter(an: Analysis, node: Node) -> tuple[str, float] | None:
    """``(parameter node, offset)`` when ``node`` is ``offset + parameter`` (through
    casts and views), e.g. Gemma's ``1 + w``; else None."""
    offset = 0.0
    while node.name not in an.traced.params:
        name = op_name(node)
        if name in TRANSPARENT and isinstance(node.args[0], Node):
            node = node.args[0]
        else:
            tensors = [a for a in node.args if isinstance(a, Node)]
            numbers = [a for a in node.args if isinstance(a, int | float)]
            plain = node.kwargs.get("alpha", 1) == 1
            if name != "add" or len(tensors) != 1 or len(numbers) != 1 or not plain:
                return None
            offset += float(numbers[0])
            node = tensors[0]
    return node.name, offset


@register(*_SELECT, *_COMPARE)
def _select(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    return _elementwise(an, node, args, "select")


@register(*_NONLINEAR)
def _nonlinear(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x = args[0]
    if not isinstance(x, Value):
        return an.free(out_shapes(node), "constant")
    an.lower([x], f"{node.target} (node {node.name!r}) acts unit by unit")
    # a function of a parameter unit by unit is still that parameter, unit by unit
    # (Swin-v2's clamped, exponentiated logit scale of each head): permutations, all
    # the level leaves, commute with it, so its axes keep their provenance
    return Value([list(a) for a in x.axes], list(x.src), const=x.const)


@register(aten.neg, aten.positive, square_safe=True)
def _neg(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    return Value([list(a) for a in x.axes], list(x.src), x.square, x.const)


@register(aten.pow, aten.square)
def _pow(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x = args[0]
    exponent = 2 if "square" in str(node.target) else args[1]
    if isinstance(x, Value) and exponent == 2 and not x.square:
        return Value([list(a) for a in x.axes], square=True, const=x.const)
    tensors = [a for a in args if isinstance(a, Value)]
    an.lower(tensors, f"{node.target} (node {node.name!r}) acts unit by unit")
    return _elementwise(an, node, args, "select")


# --------------------------------------------------------------------------- reductions


def _dims(x: Value, dims: Any) -> list[int]:
    if dims is None or dims == []:
        return list(range(x.ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % x.ndim for d in dims})


def _reduce(an: Analysis, node: Node, x: Value, dims: list[int], keepdim: bool, kind: str) -> Value:
    what = f"{node.target} (node {node.name!r})"
    for d in dims:
        if kind == "sum" and x.square:
            continue  # a squared norm: invariant under orthogonal maps
        if kind == "norm":
            continue
        if kind == "sum":  # 1^T x: kept by the orthogonal maps that fix the ones vector
            an.lattice.center(x.axes[d], f"{what} sums over the units")
            continue
        an.lattice.lower(x.axes[d], Level.PERM, f"{what} reduces over the units")
    if kind == "max":
        an.lower([x], f"{what} acts unit by unit")
    axes: list[list[Var]] = []
    src: list[frozenset[tuple[str, int]]] = []
    for i in range(x.ndim):
        if i in dims:
            if keepdim:
                axes.append([])
                src.append(frozenset())
        else:
            axes.append(list(x.axes[i]))
            src.append(frozenset())
    return Value(axes, src, False, x.const)


@register(*_ops("sum", "mean", "nansum", "nanmean"), square_safe=True)
def _sum(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    dims = _dims(x, args[1] if len(args) > 1 and not isinstance(args[1], torch.dtype) else None)
    keepdim = bool(kw.get("keepdim", args[2] if len(args) > 2 else False))
    return _reduce(an, node, x, dims, keepdim, "sum")


@register(*_ops("amax", "amin", "logsumexp", "prod", "var", "std", "var_mean", "std_mean"))
def _other_reductions(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    dims = _dims(x, args[1] if len(args) > 1 else kw.get("dim"))
    keepdim = bool(kw.get("keepdim", args[2] if len(args) > 2 and isinstance(args[2], bool) else 0))
    value = _reduce(an, node, x, dims, keepdim, "max")
    shapes = out_shapes(node)
    if isinstance(shapes, tuple) and shapes and isinstance(shapes[0], tuple):
        return (value, _reduce(an, node, x, dims, keepdim, "max"))
    return value


def _indices_used(node: Node) -> bool:
    """Whether the indices output of a ``(values, indices)`` reduction is read."""
    return any(
        user.target is operator.getitem and len(user.args) > 1 and user.args[1] == 1
        for user in node.users
    )


@register(*_ops("max", "min", "argmax", "argmin", "median", "mode"))
def _max(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    dim = args[1] if len(args) > 1 and isinstance(args[1], int) else kw.get("dim")
    if len(args) > 1 and isinstance(args[1], Value):  # max(a, b): elementwise
        return _elementwise(an, node, args, "select")
    keepdim = bool(kw.get("keepdim", args[2] if len(args) > 2 else False))
    dims = _dims(x, dim)
    pair = isinstance(out_shapes(node), tuple) and isinstance(out_shapes(node)[0], tuple)
    if str(node.target).startswith("aten.arg") or (pair and _indices_used(node)):
        # the maximum's value does not depend on the units' order, its index does
        what = f"{node.target} (node {node.name!r})"
        an.pin([Value([x.axes[d]]) for d in dims], f"{what} returns a position", notable=True)
    value = _reduce(an, node, x, dims, keepdim, "max")
    if pair:
        return (value, _reduce(an, node, x, dims, keepdim, "max"))
    return value


@register(aten.linalg_vector_norm, aten.norm)
def _norm(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    order = args[1] if len(args) > 1 else kw.get("ord", kw.get("p", 2))
    dims = _dims(x, args[2] if len(args) > 2 else kw.get("dim"))
    keepdim = bool(args[3] if len(args) > 3 else kw.get("keepdim", False))
    kind = "norm" if order in (2, 2.0, None, "fro") else "max"
    return _reduce(an, node, x, dims, keepdim, kind)


@register(*_ops("softmax", "log_softmax", "_softmax", "_log_softmax", "cumsum", "cumprod"))
def _along_axis(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x: Value = args[0]
    dim = args[1] % x.ndim
    what = f"{node.target} (node {node.name!r})"
    if str(node.target).startswith("aten.cum"):
        if not all(v.level == Level.FREE for v in an.lattice.leaves(x.axes[dim])):
            an.pin([Value([x.axes[dim]])], f"{what} runs along a feature axis", notable=True)
        return Value([list(a) for a in x.axes], const=x.const)
    an.lower([x], f"{what} acts unit by unit")
    return Value([list(a) for a in x.axes], const=x.const)


@register(*_ops("flip", "roll", "diff", "sort", "argsort", "topk", "triu", "tril"))
def _positional(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    """Ops that move or mask entries by position: harmless on pinned axes only."""
    x: Value = args[0]
    if not x.const:
        an.pin([x], f"{node.target} (node {node.name!r}) works by position", notable=True)
    shapes = out_shapes(node)
    if isinstance(shapes, tuple) and shapes and isinstance(shapes[0], tuple):
        return tuple(_const_value(an, s, x.const) for s in shapes)
    return _const_value(an, shapes, x.const)


def _const_value(an: Analysis, shape: tuple[int, ...], const: bool) -> Value:
    value = an.free(shape, "positional")
    value.const = const
    return value


#: constants holding one value everywhere
_UNIFORM = {"zeros", "ones", "full", "new_zeros", "new_ones", "new_full", "zeros_like"}
_UNIFORM |= {"ones_like", "full_like", "scalar_tensor"}


@register(*_CONSTANTS)
def _constant(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    shape = out_shapes(node)
    written = any(is_inplace(u) and u.args[0] is node for u in node.users)
    if op_name(node) in _UNIFORM and not written:
        # one value everywhere (T5's zero position bias of cross-attention): adding it
        # moves every unit alike, so it constrains an axis no more than adding a number
        value = an.fresh(shape, Level.CENTERED, "a uniform constant")
        value.const = True
        return value
    return _const_value(an, shape, True)
