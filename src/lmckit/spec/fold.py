"""Fold norm scales into the layers that read them: ``R (g * y) = (R diag(g)) y``.

A norm's elementwise scale ``g`` acts unit by unit, so a residual stream it scales keeps
only its permutation symmetry. When every consumer of the scaled value is a linear
reader, ``g`` can be multiplied into the readers' input columns and replaced by ones:
the function is unchanged, the module class is unchanged (its scale parameter is just
all ones), and the stream -- normalised by an RMSNorm, which commutes with rotations --
admits orthogonal maps. Analysed again with the folded scales declared uniform (constant
along every axis: see ``uniform`` of :func:`lmckit.spec.analyze_symmetries`), the
stream's space becomes :class:`~lmckit.groups.Orthogonal`.

Everything is read from the graph: the scale sites found by the analysis and, for each,
the readers its output flows into.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import Node

from lmckit.params import Params
from lmckit.spec.infer import SymmetryAnalysis

__all__ = ["FoldedScales", "Reader", "fold_norm_scales", "readers_of"]

# ops a scaled value may pass through on its way to a reader (views and casts)
_PASS = {"to", "_to_copy", "alias", "clone", "contiguous", "dropout", "view", "reshape",
         "_unsafe_view", "detach", "_assert_tensor_metadata"}  # fmt: skip
_TRANSPOSES = {"t", "numpy_T", "transpose", "permute"}
# ops along an axis: harmless on the way to a reader unless they touch the feature axis
_ALONG = {"select", "slice", "mean", "sum"}


def _spares_last_axis(node: Node) -> bool:
    """Whether ``node`` (select/slice/mean/sum) leaves its input's last axis alone."""
    source = node.args[0]
    dims = node.args[1] if len(node.args) > 1 else None
    if not isinstance(source, Node) or dims is None:
        return False
    ndim = source.meta["val"].ndim
    wanted = [dims] if isinstance(dims, int) else dims if isinstance(dims, list | tuple) else None
    if wanted is None or not all(isinstance(d, int) for d in wanted):
        return False
    return all(int(d) % ndim != ndim - 1 for d in wanted)


@dataclass(frozen=True)
class FoldedScales:
    """The result of :func:`fold_norm_scales`.

    Attributes:
        params: the parameters with every foldable scale folded (scales set to one).
        scales: keys of the folded scale parameters (now all ones).
        readers: key of each reader weight that absorbed a scale -> that scale's key.
        skipped: scales that could not be folded, with the reason.
    """

    params: Params
    scales: frozenset[str]
    readers: dict[str, str]
    skipped: tuple[str, ...]


def _op(node: Node) -> str:
    target = getattr(node.target, "overloadpacket", node.target)
    return str(getattr(target, "__name__", target))


def _param_of(node: object, params: dict[str, str]) -> tuple[str, bool] | None:
    """``(key, transposed)`` if ``node`` is a parameter placeholder or a transpose of one."""
    if not isinstance(node, Node):
        return None
    if node.name in params:
        return params[node.name], False
    if _op(node) in _TRANSPOSES and isinstance(node.args[0], Node) and node.args[0].name in params:
        return params[node.args[0].name], True
    return None


@dataclass(frozen=True)
class Reader:
    """A linear layer reading a value: its weight, the weight's input axis, its bias."""

    weight: str
    axis: int
    bias: str | None


def readers_of(node: Node, params: dict[str, str]) -> list[Reader] | str:
    """Every linear layer ``node``'s value flows into (through views and casts), or why
    some consumer is not one."""
    found: list[Reader] = []
    frontier = [node]
    while frontier:
        value = frontier.pop()
        for user in value.users:
            op = _op(user)
            bias: object = None
            if op in _PASS and user.args[0] is value:
                frontier.append(user)
                continue
            if op in _ALONG and user.args[0] is value and _spares_last_axis(user):
                frontier.append(user)  # picks or averages tokens, not features
                continue
            if op == "linear" and user.args[0] is value:
                weight = _param_of(user.args[1], params)
                axis, bias = 1, user.args[2] if len(user.args) > 2 else None
                if weight is not None and weight[1]:
                    weight = None
            elif op == "addmm" and user.args[1] is value:  # Conv1D: b + x @ W, W is (in, out)
                weight, axis, bias = _param_of(user.args[2], params), 0, user.args[0]
                if weight is not None and weight[1]:
                    weight = None
            elif op in ("matmul", "mm") and user.args[0] is value:
                weight = _param_of(user.args[1], params)
                axis = 1 if weight is not None and weight[1] else 0
            else:
                return f"{user.name} ({op}) consumes the value"
            if weight is None:
                return f"{user.name} multiplies by something other than a parameter"
            bias_key = params.get(bias.name) if isinstance(bias, Node) else None
            found.append(Reader(weight[0], axis, bias_key))
    return found


def fold_norm_scales(analysis: SymmetryAnalysis, params: Params) -> FoldedScales:
    """Fold every norm scale whose value only linear layers read (see module docstring).

    Args:
        analysis: the module's symmetry analysis (its scale sites and graph).
        params: parameters of that module (tied weights once, as lmckit keeps them);
            not modified.
    """
    graph_params = dict(analysis.traced.params)
    nodes = {n.name: n for n in analysis.traced.graph.nodes}
    users_of: dict[str, int] = {}
    for ph, key in graph_params.items():  # a tied weight may be lifted more than once
        users_of[key] = users_of.get(key, 0) + len(nodes[ph].users)
    out = dict(params)
    folded: set[str] = set()
    readers: dict[str, str] = {}
    skipped: list[str] = []
    for site in analysis.scales:
        if site.weight is None or site.kind == "layer":
            continue  # affine-free, or a LayerNorm (its mean needs the LayerNorm rewrite)
        scale = graph_params[site.weight]
        found = readers_of(nodes[site.node], graph_params)
        if isinstance(found, str):
            skipped.append(f"{scale}: {found}")
            continue
        shared = [r.weight for r in found if users_of.get(r.weight, 0) > 1]
        if shared:
            skipped.append(f"{scale}: its reader {shared[0]} is also used elsewhere (tied)")
            continue
        g = out[scale].double()
        for weight, axis in ((r.weight, r.axis) for r in found):
            shape = [1] * out[weight].ndim
            shape[axis] = -1
            out[weight] = (out[weight].double() * g.reshape(shape)).to(out[weight].dtype)
            readers[weight] = scale
        out[scale] = torch.ones_like(out[scale])
        folded.add(scale)
    return FoldedScales(out, frozenset(folded), readers, tuple(skipped))
