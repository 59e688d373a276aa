"""Two modules held in memory are one architecture only if they compute alike.

Models read from files are compared by their configuration
(:func:`lmckit.formats.check_same_architecture`): the same class and config build the same
code. Two modules a caller holds carry no such
record: an ``nn.Sequential`` whose B has a ``ChannelShuffle`` where A has a ``ReLU``, or
the same class with another flag, has A's parameter names and shapes and another
function; so does a pair whose buffers outside the state dict (non-persistent buffers,
tensors held as plain attributes) differ. :func:`check_same_graph` compares what the
function is made of: the same submodules (names and classes), every tensor held outside
the state dicts equal, and, for modules without a config (tracing costs about a second
per model), both traced on the same example inputs (:func:`lmckit.inference._trace.trace`)
running the same ATen ops on the same arguments.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Node

from lmckit.inference._inputs import ExampleInputs, split_inputs
from lmckit.inference._trace import trace
from lmckit.symmetry._params import IncompatibleModelsError

__all__ = ["check_same_graph"]


def check_same_graph(
    a: nn.Module, b: nn.Module, example_inputs: ExampleInputs, *, traced: bool = True
) -> None:
    """Refuse two modules whose functions of their weights differ.

    Args:
        a, b: the modules (traced in eval mode; not changed).
        example_inputs: inputs both are traced on (a tensor, a tuple, a dict of keywords).
        traced: also compare the traced graphs (``False``: modules whose equal configs
            already say they run the same code, e.g. two ``transformers`` models).

    Raises:
        IncompatibleModelsError: naming the first tensor outside the state dict that
            differs, or the first op where the traced graphs part.
        SpecInferenceError: a module that does not trace (naming why).
    """
    _check_submodules(a, b)
    _check_held_tensors(a, b)
    if not traced:
        return
    args, kwargs = split_inputs(example_inputs, module=a)
    ops_a = list(_ops(trace(a, args, kwargs=kwargs).graph.nodes))
    ops_b = list(_ops(trace(b, args, kwargs=kwargs).graph.nodes))
    for k, (op_a, op_b) in enumerate(zip(ops_a, ops_b, strict=False)):
        if op_a != op_b:
            raise IncompatibleModelsError(
                f"their traced graphs differ at op {k}: {_say(op_a)} in a, {_say(op_b)} in b"
            )
    if len(ops_a) != len(ops_b):
        raise IncompatibleModelsError(
            f"their traced graphs differ: {len(ops_a)} ops in a, {len(ops_b)} in b"
        )


def _ops(nodes: Any) -> Iterator[tuple[str, str, Any]]:
    """Each op of a graph as ``(kind, target, arguments)``, arguments with nodes given as
    their positions (two graphs of one code number their nodes alike)."""
    index: dict[Node, int] = {}
    for node in nodes:
        index[node] = len(index)
        if node.op in ("call_function", "call_method", "call_module"):
            args = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: f"%{index[n]}")
            yield node.op, str(node.target), _plain(args)


def _plain(value: Any) -> Any:
    """Arguments comparable with ``==``: tensors by their values."""
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape), tuple(value.reshape(-1).tolist()))
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _plain(v)) for k, v in value.items())
    return value


def _say(op: tuple[str, str, Any]) -> str:
    text = f"{op[1]}{op[2]}"
    return text if len(text) <= 120 else text[:117] + "..."


def _check_submodules(a: nn.Module, b: nn.Module) -> None:
    kinds_a = {n: type(m) for n, m in a.named_modules()}
    kinds_b = {n: type(m) for n, m in b.named_modules()}
    for name in [*kinds_a, *(n for n in kinds_b if n not in kinds_a)]:
        ka, kb = kinds_a.get(name), kinds_b.get(name)
        if ka is not kb:
            what = name or "the model"
            raise IncompatibleModelsError(f"{what} is {_kind(ka)} in a and {_kind(kb)} in b")


def _kind(cls: type | None) -> str:
    return "missing" if cls is None else f"a {cls.__name__}"


def _held_tensors(module: nn.Module) -> dict[str, Tensor]:
    """Tensors the module computes with that its state dict leaves out: non-persistent
    buffers and tensors held as plain attributes (``torch.export`` lifts both as
    constants)."""
    state = set(module.state_dict(keep_vars=True))
    out: dict[str, Tensor] = {}
    for name, buffer in module.named_buffers():
        if name not in state:
            out[name] = buffer
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if isinstance(value, Tensor) and not attr.startswith("_"):
                out[f"{prefix}.{attr}" if prefix else attr] = value
    return out


def _check_held_tensors(a: nn.Module, b: nn.Module) -> None:
    held_a, held_b = _held_tensors(a), _held_tensors(b)
    for name in sorted(held_a.keys() | held_b.keys()):
        if name not in held_a or name not in held_b:
            where = "a" if name in held_a else "b"
            raise IncompatibleModelsError(f"only {where} holds the tensor {name!r}")
        ta, tb = held_a[name], held_b[name]
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            raise IncompatibleModelsError(
                f"the tensor {name!r} (outside the state dict) is {tuple(ta.shape)} "
                f"{ta.dtype} in a, {tuple(tb.shape)} {tb.dtype} in b"
            )
        if not torch.equal(ta.detach().cpu(), tb.detach().cpu()):
            differ = ""
            if ta.is_floating_point():
                gap = float((ta.detach().double() - tb.detach().double()).abs().max())
                differ = f" by up to {gap:.3g}"
            raise IncompatibleModelsError(
                f"the buffer {name!r} is not in the state dict (B's would not be written) "
                f"and differs between a and b{differ}"
            )
