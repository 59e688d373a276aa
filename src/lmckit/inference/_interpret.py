"""Run the op rules over a traced graph: one abstract value per node."""

from __future__ import annotations

import operator
from typing import Any

from torch.fx import Node

from lmckit.inference import _elementwise as _elementwise  # noqa: F401  (registers rules)
from lmckit.inference import _filling as _filling  # noqa: F401  (registers rules)
from lmckit.inference import _layers as _layers  # noqa: F401  (registers rules)
from lmckit.inference import _pooling as _pooling  # noqa: F401  (registers rules)
from lmckit.inference import _slicing as _slicing  # noqa: F401  (registers rules)
from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._graph import is_inplace
from lmckit.inference._lattice import Level
from lmckit.inference._rules import NAMED_RULES, RULES, SQUARE_SAFE, out_shapes, unknown_op
from lmckit.inference._trace import TracedGraph

__all__ = ["interpret"]


def _packet(target: Any) -> Any:
    """The op packet a rule is registered under (every overload of an op shares it)."""
    if target is operator.getitem:
        return target
    return getattr(target, "overloadpacket", target)


def _name(packet: Any) -> str:
    return str(getattr(packet, "__name__", packet))


def _tensors(obj: Any) -> list[Value]:
    if isinstance(obj, Value):
        return [obj]
    if isinstance(obj, list | tuple):
        return [v for item in obj for v in _tensors(item)]
    if isinstance(obj, dict):
        return [v for item in obj.values() for v in _tensors(item)]
    return []


def _placeholder(an: Analysis, node: Node, uniform: frozenset[str]) -> Any:
    shape = out_shapes(node)
    if not (isinstance(shape, tuple) and all(isinstance(s, int) for s in shape)):
        return node.meta.get("val")  # a non-tensor input: passed through as is
    traced = an.traced
    if traced.params.get(node.name) in uniform:
        # the same value everywhere: like a broadcast scalar, it constrains no axis
        return Value([[] for _ in shape], const=True)
    if node.name in traced.params:
        key = traced.params[node.name]
        if key in an.param_vars:  # a tied weight lifted twice: one tensor, one set of axes
            axes = [[v] for v in an.param_vars[key]]
            return Value(axes, [frozenset({(key, i)}) for i in range(len(shape))])
        value = an.fresh(shape, Level.ORTH)
        value.const = False
        value.src = [frozenset({(key, i)}) for i in range(len(shape))]
        an.param_vars[key] = [axis[0] for axis in value.axes]
        return value
    if node.name in traced.inputs:
        value = an.free(shape, "a model input")
        value.const = False
        return value
    return an.free(shape, "a constant")  # lifted constants, non-persistent buffers


def interpret(traced: TracedGraph, *, uniform: frozenset[str] = frozenset()) -> Analysis:
    """Abstract values of every node of ``traced``; variables constrained by the rules.

    ``uniform``: state-dict keys of parameters that are constant along every axis (norm
    scales folded to ones): they constrain nothing and belong to no space.
    """
    an = Analysis(traced)
    live = _live_nodes(traced)
    for node in traced.graph.nodes:
        if node.op == "call_function" and node not in live:
            # nothing reads its result (a slice taken for its shape only): it constrains
            # nothing, as it changes no output
            an.values[node.name] = None
        elif node.op == "placeholder":
            an.values[node.name] = _placeholder(an, node, uniform)
        elif node.op == "call_function":
            args = an.value(node.args)
            kwargs = {k: an.value(v) for k, v in node.kwargs.items()}
            packet = _packet(node.target)
            rule = RULES.get(packet) or NAMED_RULES.get(_name(packet), unknown_op)
            if packet not in SQUARE_SAFE:
                squares = [v for v in _tensors([args, kwargs]) if v.square]
                an.lower(squares, f"{node.target} (node {node.name!r}) uses a square")
            an.values[node.name] = _apply(rule, an, node, args, kwargs)
        elif node.op == "output":
            judged = list(node.args[0])
            if traced.outputs is not None:  # the prediction only (see lmckit.inference._trace)
                judged = [judged[i] for i in traced.outputs]
            an.pin(_tensors(an.value(judged)), "reaches the model's output")
        else:  # get_attr (submodules of higher-order ops): handled by their users
            an.values[node.name] = None
    for key in _unread(traced, live):
        an.note(f"{key}: read by no traced op on the example inputs, so it is in no space")
    return an


def _unread(traced: TracedGraph, live: set[Node]) -> list[str]:
    """State-dict keys of floating-point parameters (and buffers) that no op reaching an
    output reads: no rule sees them, so they stay as they are while spaces move what
    they would meet on other inputs (a mask token read only where patches are masked)."""
    read, unread = set(), []
    for node in traced.graph.nodes:
        key = traced.params.get(node.name) if node.op == "placeholder" else None
        if key is None:
            continue
        if any(user in live for user in node.users):
            read.add(key)
        elif getattr(node.meta.get("val"), "is_floating_point", lambda: False)():
            unread.append(key)
    return [key for key in dict.fromkeys(unread) if key not in read]


def _apply(rule: Any, an: Analysis, node: Node, args: Any, kwargs: dict[str, Any]) -> Any:
    """``rule``'s value of ``node``; an op whose rule cannot read it (a layout no rule
    foresaw) is treated as an op without a rule: what it touches is left out, said in
    one line, and the rest of the graph is read on."""
    try:
        return rule(an, node, args, kwargs)
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as err:
        first = (str(err).splitlines() or [""])[0][:200]
        an.note(
            f"{node.target} (node {node.name!r}): its rule failed ({type(err).__name__}: {first})"
        )
        return unknown_op(an, node, args, kwargs)


def _live_nodes(traced: TracedGraph) -> set[Node]:
    """Nodes whose values reach an output: found backwards from the outputs and from ops
    that change a tensor in place (their effect is read through the tensor itself)."""
    roots = [n for n in traced.graph.nodes if n.op == "output" or is_inplace(n)]
    live: set[Node] = set()
    while roots:
        node = roots.pop()
        if node in live:
            continue
        live.add(node)
        roots.extend(node.all_input_nodes)
    return live
