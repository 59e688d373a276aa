"""Which linear layers read a value: the graph walked forward through views and casts.

Folding a norm's scale into its readers (:mod:`lmckit.inference._fold`) and moving a gated
branch's scales into the layers reading the gate (:mod:`lmckit.inference._gating`) both need
every consumer of a value to be a linear layer, and its weight and input axis.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import Node

from lmckit.inference._trace import module_path

__all__ = ["Reader", "readers_of"]

# ops a scaled value may pass through on its way to a reader (views and casts)
_PASS = {"to", "_to_copy", "alias", "clone", "contiguous", "dropout", "view", "reshape",
         "_unsafe_view", "detach", "_assert_tensor_metadata", "type_as"}  # fmt: skip
_TRANSPOSES = {"t", "numpy_T", "transpose", "permute"}
# ops that give a weight's values unchanged but for their dtype
_CASTS = {"to", "_to_copy", "type_as", "alias", "clone", "contiguous"}
# a grouped matrix product (mixtures of experts): tokens x each expert's weight
_GROUPED = {"grouped_mm_fallback", "_grouped_mm", "grouped_mm"}
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


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _indexes_tokens(node: Node) -> bool:
    """Whether indexing ``node`` (``x[idx]``) leaves its input's last axis alone."""
    source, indices = node.args[0], node.args[1]
    if not isinstance(source, Node) or not isinstance(indices, list | tuple):
        return False
    ndim = source.meta["val"].ndim
    return len(indices) < ndim or indices[ndim - 1] is None


def _op(node: Node) -> str:
    target = getattr(node.target, "overloadpacket", node.target)
    return str(getattr(target, "__name__", target))


def _param_of(node: object, params: dict[str, str]) -> tuple[str, bool] | None:
    """``(key, transposed)`` if ``node`` is a parameter placeholder or a transpose of one
    (either seen through casts: DeepSeek's router reads its weight in float32)."""
    while isinstance(node, Node) and _op(node) in _CASTS and isinstance(node.args[0], Node):
        node = node.args[0]
    if not isinstance(node, Node):
        return None
    if node.name in params:
        return params[node.name], False
    if _op(node) in _TRANSPOSES and isinstance(node.args[0], Node):
        inner = node.args[0]
        while _op(inner) in _CASTS and isinstance(inner.args[0], Node):
            inner = inner.args[0]
        if inner.name in params:
            return params[inner.name], True
    return None


@dataclass(frozen=True)
class Reader:
    """A linear layer reading a value: its weight, the weight's input axis, its bias,
    and the module that ran it (its qualified name; ``""``: the root)."""

    weight: str
    axis: int
    bias: str | None
    module: str = ""


def readers_of(
    node: Node, params: dict[str, str], unjudged: frozenset[str] = frozenset()
) -> list[Reader] | str:
    """Every linear layer ``node``'s value flows into (through views and casts), or why
    some consumer is not one. Returned as an output the function is not judged by
    (``unjudged``, node names), a value has no reader there."""
    found: list[Reader] = []
    frontier = [node]
    while frontier:
        value = frontier.pop()
        for user in value.users:
            op = _op(user)
            bias: object = None
            if user.op == "output" and value.name in unjudged:
                continue
            if op in _PASS and user.args[0] is value:
                frontier.append(user)
                continue
            if op in _ALONG and user.args[0] is value and _spares_last_axis(user):
                frontier.append(user)  # picks or averages tokens, not features
                continue
            if op in ("mul", "div") and user.args[0] is value and _is_number(user.args[1]):
                frontier.append(user)  # a number scales every feature alike (T5's d**-0.5)
                continue
            if op == "index" and user.args[0] is value and _indexes_tokens(user):
                frontier.append(user)  # the tokens routed to one expert
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
            elif op in _GROUPED and user.args[0] is value:
                # experts' stacked weights, (experts, in, out) as multiplied: the stored
                # (experts, out, in) is transposed
                weight = _param_of(user.args[1], params)
                axis = 2 if weight is not None and weight[1] else 1
            elif op in ("matmul", "mm") and user.args[0] is value:
                weight = _param_of(user.args[1], params)
                axis = 1 if weight is not None and weight[1] else 0
            else:
                return f"{user.name} ({op}) consumes the value"
            if weight is None:
                return f"{user.name} multiplies by something other than a parameter"
            bias_key = params.get(bias.name) if isinstance(bias, Node) else None
            found.append(Reader(weight[0], axis, bias_key, module_path(user)))
    return found
