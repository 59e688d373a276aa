"""Op rules, part 3: layers -- linear maps and contractions, attention, embeddings,
convolutions and norms (pooling: :mod:`lmckit.inference._pooling`).

Every linear map is a contraction: an index shared by an activation and a weight and
absent from the output is *contracted* (the weight's axis reads the space, any group
element ``T`` on both sides cancels), an index carried from one operand to the output is
*written*, and an index shared by two operands and the output is a *batch* index (an
attention head): the op runs per slice, so only permutations of the slices survive.
"""

from __future__ import annotations

import string
from typing import Any

import torch
from torch.fx import Node

from lmckit.inference._analysis import Analysis, AttentionSite, ExpertSite, ScaleSite, Value
from lmckit.inference._eager_attention import eager_site
from lmckit.inference._elementwise import scale_parameter
from lmckit.inference._lattice import Level, Var
from lmckit.inference._rules import _ops, axis_size, out_shapes, register, register_named

__all__ = ["contract"]

aten = torch.ops.aten


def contract(an: Analysis, node: Node, operands: list[tuple[Value, str]], out: str) -> Value:
    """Abstract ``einsum`` of ``operands`` (value, one letter per axis) into ``out``."""
    what = f"{node.target} (node {node.name!r})"
    places: dict[str, list[tuple[Value, int]]] = {}
    for value, letters in operands:
        for j, letter in enumerate(letters):
            places.setdefault(letter, []).append((value, j))
    factors: dict[str, list[Var]] = {}
    for letter, where in places.items():
        full = [(v, j) for v, j in where if axis_size(v, j) > 1]
        if not full:
            continue
        (v0, j0), rest = full[0], full[1:]
        for v, j in rest:
            an.unify(v0.axes[j0], v.axes[j], what)
        factors[letter] = list(v0.axes[j0])
        # an axis of size one broadcast against it (one key head for every query head)
        # batches the product as much as a full one does
        batched = len(where) > 1 and all(not v.src[j] for v, j in where)
        if letter in out and (rest or batched):
            an.lattice.lower(factors[letter], Level.PERM, f"{what} runs per slice")
            if all(not v.src[j] for v, j in full):  # two activations: attention heads
                for leaf in an.lattice.leaves(factors[letter]):
                    leaf.heads = True
            for v, j in full:
                an.mark(v, j, "elementwise")
        elif letter in out:
            an.mark(v0, j0, "write")
        elif rest:
            for v, j in full:
                an.mark(v, j, "read")
        elif not v0.square:
            an.lattice.lower(factors[letter], Level.PERM, f"{what} sums over the units")
    axes = [factors.get(letter, []) for letter in out]
    return Value(axes, const=all(v.const for v, _ in operands))


def _letters(n: int, skip: str = "") -> str:
    pool = [c for c in string.ascii_lowercase if c not in skip]
    return "".join(pool[:n])


def _add_bias(an: Analysis, node: Node, out: Value, bias: Any, axis: int = -1) -> None:
    if isinstance(bias, Value) and bias.ndim >= 1:
        an.unify(out.axes[axis], bias.axes[-1], f"bias of {node.name!r}")
        an.mark(bias, bias.ndim - 1, "write")


@register(aten.linear)
def _linear(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else kw.get("bias")
    lead = _letters(x.ndim - 1)
    out = contract(an, node, [(x, lead + "K"), (weight, "MK")], lead + "M")
    _add_bias(an, node, out, bias)
    return out


def _matmul_letters(na: int, nb: int) -> tuple[str, str, str]:
    """Einsum letters of ``matmul`` for operands of ``na`` and ``nb`` dimensions."""
    if na == 1 and nb == 1:
        return "K", "K", ""
    if na == 1:
        batch = _letters(nb - 2)
        return "K", batch + "KM", batch + "M"
    if nb == 1:
        batch = _letters(na - 2)
        return batch + "NK", "K", batch + "N"
    n = max(na, nb) - 2  # batch dimensions broadcast from the right
    batch = _letters(n)
    return batch[n - (na - 2) :] + "NK", batch[n - (nb - 2) :] + "KM", batch + "NM"


@register(aten.matmul, aten.mm, aten.bmm)
def _matmul(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    a, b = args[0], args[1]
    la, lb, lo = _matmul_letters(a.ndim, b.ndim)
    out = contract(an, node, [(a, la), (b, lb)], lo)
    site = eager_site(an, node)  # attention weights applied to values, written out
    if site is not None:
        an.attention.append(site)
    return out


@register(aten.addmm, aten.baddbmm, aten.addmv)
def _addmm(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    bias, a, b = args[0], args[1], args[2]
    la, lb, lo = _matmul_letters(a.ndim, b.ndim)
    out = contract(an, node, [(a, la), (b, lb)], lo)
    if isinstance(bias, Value) and (bias.const or not any(bias.src)):
        # a table added to every product (BLOOM's ALiBi slopes added to the scores of
        # each head): it meets the product on every axis it does not broadcast along
        _broadcast_meet(an, bias, out, f"{node.target} (node {node.name!r})")
    else:
        _add_bias(an, node, out, bias)
    return out


@register(aten.einsum)
def _einsum(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    equation: str = args[0].replace(" ", "")
    operands = list(args[1])
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if "..." in equation:
        width = max(
            v.ndim - (len(t) - 3) for v, t in zip(operands, terms, strict=True) if "..." in t
        )
        spare = _letters(width, skip=equation.lower())
        terms = [t.replace("...", spare[width - (v.ndim - (len(t) - 3)) :]) for v, t in
                 zip(operands, terms, strict=True)]  # fmt: skip
        rhs = rhs.replace("...", spare)
    if not arrow:
        counts = {c: lhs.count(c) for c in set(lhs) - {","}}
        rhs = "".join(sorted(c for c, n in counts.items() if n == 1))
    return contract(an, node, list(zip(operands, terms, strict=True)), rhs)


# --------------------------------------------------------------------------- attention


def _broadcast_meet(an: Analysis, small: Value, big: Value, what: str) -> None:
    """``small`` added to ``big`` (broadcast from the right). A table of constants
    constrains the axes it varies along (a mask, ALiBi's per-head slopes: see
    :meth:`~lmckit.inference._lattice.Lattice.constrain`) without tying together the
    activations that meet it (T5's cross-attention layers share one bias of zeros); any
    other tensor is the same units as ``big`` (a learned position bias shared by every
    layer ties their heads)."""
    for i in range(1, min(small.ndim, big.ndim) + 1):
        if axis_size(small, -i) > 1 and axis_size(big, -i) > 1:
            if small.const and not big.const:
                an.lattice.constrain(big.axes[-i], small.axes[-i], what)
            else:
                an.unify(small.axes[-i], big.axes[-i], what)
                an.mark(small, small.ndim - i, "write")  # a learned table's heads, say


def _grouped(an: Analysis, kv: Value, heads_q: int) -> Value:
    """Keys or values of grouped-query attention as the query heads see them."""
    heads_kv = axis_size(kv, -3)
    if heads_kv == heads_q:
        return kv
    # the query heads of a group share its key/value head: the copies are equal, so
    # any permutation of them keeps the keys and values; on the query side it permutes
    # the group's query heads (multi-query attention: one group of all of them)
    copies = an.lattice.fresh(heads_q // heads_kv, Level.PERM, "query heads share a key head")
    axes = [list(a) for a in kv.axes]
    axes[-3] = [*axes[-3], copies]
    return Value(axes, const=kv.const)


@register(aten.scaled_dot_product_attention)
def _sdpa(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    q, k, v = args[0], args[1], args[2]
    mask = args[3] if len(args) > 3 else kw.get("attn_mask")
    if q.ndim >= 3:
        k, v = _grouped(an, k, axis_size(q, -3)), _grouped(an, v, axis_size(q, -3))
    batch = _letters(q.ndim - 2)
    scores = contract(an, node, [(q, batch + "LE"), (k, batch + "SE")], batch + "LS")
    if isinstance(mask, Value):
        _broadcast_meet(an, mask, scores, f"attention mask of {node.name!r}")
    an.lower([scores], f"softmax of {node.name!r}")
    out = contract(an, node, [(scores, batch + "LS"), (v, batch + "SV")], batch + "LV")
    names = [a.name if isinstance(a, Node) else "" for a in node.args[:3]]
    an.attention.append(AttentionSite(node.name, *names))
    return out


@register_named("grouped_mm_fallback", "_grouped_mm", "grouped_mm")
def _grouped_mm(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    """``out[rows of segment g] = x[rows of segment g] @ w[g]``: the experts of a mixture.

    Each expert reads the same input features and writes its own units; which rows an
    expert gets is decided by the offsets (a router's choice), so the expert axis of the
    weights is pinned here and proposed as a permutation that a check decides
    (:mod:`lmckit.inference._experts`).
    """
    x, weight = args[0], args[1]
    offsets = args[2] if len(args) > 2 else kw.get("offs")
    what = f"{node.target} (node {node.name!r})"
    if not (isinstance(x, Value) and isinstance(weight, Value)) or weight.ndim != 3 or x.ndim != 2:
        an.pin(
            [v for v in (x, weight) if isinstance(v, Value)],
            f"{what}: not understood",
            notable=True,
        )
        return an.free(out_shapes(node), what)
    an.unify(x.axes[1], weight.axes[1], what)
    an.mark(weight, 1, "read")
    an.mark(weight, 2, "write")
    an.lattice.pin(weight.axes[0], f"{what}: experts are chosen by a router")
    keys = [k for k, _ in weight.src[0]]
    names = [a.name for a in node.args[1:3] if isinstance(a, Node)]
    if keys and len(names) == 2 and isinstance(offsets, Value):
        an.experts.append(ExpertSite(node.name, keys[0], names[1]))
    rows = an.lattice.fresh(out_shapes(node)[0], Level.FREE, "rows of every expert")
    return Value([[rows], list(weight.axes[2])])


@register(aten.embedding)
def _embedding(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    weight, idx = args[0], args[1]
    an.lattice.pin(weight.axes[0], "embedding rows are looked up by index")
    an.mark(weight, 1, "write")
    return Value([list(a) for a in idx.axes] + [list(weight.axes[1])])


# --------------------------------------------------------------------------- convolution


def _conv_args(node: Node, args: tuple[Any, ...]) -> tuple[Any, bool, int]:
    name = str(node.target)
    if "convolution" in name:  # (x, w, b, stride, padding, dilation, transposed, out_pad, groups)
        return args[2], bool(args[6]), int(args[8])
    if "transpose" in name:  # (x, w, b, stride, padding, output_padding, groups, dilation)
        return (args[2] if len(args) > 2 else None), True, int(args[6] if len(args) > 6 else 1)
    return (args[2] if len(args) > 2 else None), False, int(args[6] if len(args) > 6 else 1)


@register(*_ops("conv1d", "conv2d", "conv3d", "convolution"))
@register(*_ops("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"))
def _conv(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x, weight = args[0], args[1]
    bias, transposed, groups = _conv_args(node, args)
    shape = out_shapes(node)
    ch = x.ndim - weight.ndim + 1  # channel axis of the input (1 when batched)
    w_in, w_out = (0, 1) if transposed else (1, 0)
    what = f"{node.target} (node {node.name!r})"
    for axis in weight.axes[2:]:
        an.lattice.pin(axis, "kernel taps")
    out_axes = [list(a) for a in x.axes[:ch]] + [list(weight.axes[w_out])]
    out_axes += [[an.lattice.fresh(s, Level.FREE, "spatial")] for s in shape[ch + 1 :]]
    out = Value(out_axes)
    if groups == 1:
        an.unify(x.axes[ch], weight.axes[w_in], what)
        an.mark(weight, w_in, "read")
        an.mark(weight, w_out, "write")
    elif not transposed and axis_size(weight, 1) == 1 and groups == axis_size(x, ch):
        # depthwise: channel c in, channel c out; the filters move with their channels
        an.unify(x.axes[ch], weight.axes[0], what)
        an.lattice.lower(weight.axes[0], Level.PERM, f"{what} filters each channel alone")
        an.mark(weight, 0, "elementwise")
    else:
        an.pin(
            [Value([x.axes[ch]]), Value([weight.axes[0]]), Value([weight.axes[1]])],
            f"{what}: grouped convolution",
            notable=True,
        )
    if isinstance(bias, Value):
        an.unify(out.axes[ch], bias.axes[0], what)
        an.mark(bias, 0, "elementwise" if groups > 1 else "write")
    return out


# --------------------------------------------------------------------------- norms


def _unit_params(an: Analysis, node: Node, axis: list[Var], params: list[Any]) -> None:
    for p in params:
        if isinstance(p, Value) and p.ndim >= 1:
            an.unify(axis, p.axes[0] if p.ndim == 1 else p.axes[-1], f"{node.name!r}")
            an.mark(p, 0 if p.ndim == 1 else p.ndim - 1, "elementwise")


def _name(arg: Any) -> str | None:
    return arg.name if isinstance(arg, Node) else None


def _scale_of(an: Analysis, arg: Any) -> tuple[str | None, float]:
    """The parameter node a norm's weight argument is, and the number added to it
    (Nemotron's ``F.layer_norm(x, shape, weight + 1, ...)``); ``(None, 0.0)`` for no
    weight or one computed otherwise (it is then no scale to fold)."""
    if not isinstance(arg, Node):
        return None, 0.0
    found = scale_parameter(an, arg)
    return found if found is not None else (None, 0.0)


@register(aten.layer_norm, aten.native_layer_norm)
def _layer_norm(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x, shape = args[0], args[1]
    weight = args[2] if len(args) > 2 else kw.get("weight")
    bias = args[3] if len(args) > 3 else kw.get("bias")
    eps = float(args[4] if len(args) > 4 else kw.get("eps", 1e-5))
    dims = list(range(x.ndim - len(shape), x.ndim))
    scaled = isinstance(weight, Value) and any(weight.axes)
    for d in dims:
        # the mean subtraction keeps the maps that fix the mean direction; a scale that
        # varies along the units keeps only permutations (folded, it is uniform)
        if scaled:
            an.lattice.lower(x.axes[d], Level.PERM, f"LayerNorm {node.name!r} scales each unit")
        else:
            an.lattice.center(x.axes[d], f"LayerNorm {node.name!r} subtracts the mean")
    if len(dims) == 1 and scaled:
        _unit_params(an, node, x.axes[dims[0]], [weight, bias])
    elif len(dims) == 1 and isinstance(bias, Value) and any(bias.axes):
        # after a uniform scale the shift is a vector added to the stream: it writes it
        an.unify(x.axes[dims[0]], bias.axes[0], f"{node.name!r}")
        an.mark(bias, 0, "write")
    weight_name, offset = _scale_of(an, node.args[2] if len(node.args) > 2 else None)
    bias_name = _name(node.args[3] if len(node.args) > 3 else None)
    if weight_name is not None or not scaled:
        site = ScaleSite(node.name, weight_name, bias_name, "layer", eps, offset=offset)
        an.scales.append(site)
    out = Value([list(a) for a in x.axes])
    if "native" in str(node.target):
        shapes = out_shapes(node)
        return (out, an.free(shapes[1], "statistics"), an.free(shapes[2], "statistics"))
    return out


@register(*_ops("rms_norm"))
def _rms_norm(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x = args[0]
    weight = args[2] if len(args) > 2 else kw.get("weight")
    eps = args[3] if len(args) > 3 else kw.get("eps")
    if isinstance(weight, Value):
        axis = x.axes[x.ndim - 1]
        an.lattice.lower(axis, Level.PERM, f"RMSNorm {node.name!r} scales each unit")
        _unit_params(an, node, axis, [weight])
    weight_name, offset = _scale_of(an, node.args[2] if len(node.args) > 2 else None)
    if weight_name is not None or not isinstance(weight, Value):
        an.scales.append(ScaleSite(node.name, weight_name, None, "rms", eps, offset=offset))
    return Value([list(a) for a in x.axes])


@register(aten.group_norm, aten.native_group_norm)
def _group_norm(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x = args[0]
    native = "native" in str(node.target)
    groups = int(args[6] if native else args[1])
    weight, bias = (args[1], args[2]) if native else (args[2], args[3])
    axis = x.axes[1]
    for leaf in an.lattice.leaves(axis):
        leaf.blocks = groups if leaf.blocks == 1 else leaf.blocks
    an.lattice.lower(axis, Level.PERM, f"GroupNorm {node.name!r} normalises groups of units")
    _unit_params(an, node, axis, [weight, bias])
    out = Value([list(a) for a in x.axes])
    if native:
        shapes = out_shapes(node)
        return (out, an.free(shapes[1], "statistics"), an.free(shapes[2], "statistics"))
    return out


@register(*_ops("batch_norm", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit"))
@register(*_ops("instance_norm", "native_batch_norm"))
def _batch_norm(an: Analysis, node: Node, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    x = args[0]
    axis = x.axes[1] if x.ndim > 1 else x.axes[0]
    an.lattice.lower(axis, Level.PERM, f"BatchNorm {node.name!r} scales each channel")
    _unit_params(an, node, axis, [a for a in args[1:5] if isinstance(a, Value)])
    out = Value([list(a) for a in x.axes])
    shapes = out_shapes(node)
    if isinstance(shapes, tuple) and shapes and isinstance(shapes[0], tuple):
        return (out, *(an.free(s, "statistics") for s in shapes[1:]))
    return out
