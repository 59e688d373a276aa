"""Tracing a module into the ATen graph that symmetry inference reads.

``torch.export`` (non-strict) is the tracer: it records every tensor operation the
module runs on the example inputs, whatever the module's style (``nn.Linear``,
``F.linear``, ``x @ W.T``, Hugging Face's ``Conv1D``), as a flat graph of ATen ops whose
placeholders are named parameters, buffers and inputs. ``torch.fx.symbolic_trace``
would need every model's control flow to be symbolic, which Hugging Face models are not;
export runs the real Python code on fake tensors, so shape-dependent branches just
specialise to the example's shapes, which inference does not depend on.

A model's function is its outputs, except that a Hugging Face output with logits is
judged by its prediction alone (:func:`prediction`): the hidden states it also returns
(an encoder-decoder's ``encoder_last_hidden_state``) are intermediate values exposed for
convenience, and holding them fixed would forbid every symmetry of the stream.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.fx import Graph, Node

from lmckit.inference._inputs import bind_inputs, describe_inputs
from lmckit.inference._trace_failure import describe_failure

__all__ = ["SpecInferenceError", "TracedGraph", "module_path", "prediction", "trace"]

#: the fields of a Hugging Face output that make its prediction (besides ``*logits``)
_PREDICTION = ("loss",)


def _is_prediction(key: str) -> bool:
    return key in _PREDICTION or key.endswith("logits")


def _has_logits(keys: list[Any]) -> bool:
    return any(isinstance(k, str) and k.endswith("logits") for k in keys)


def prediction(output: Any) -> Any:
    """The part of a module's output its function is judged by: of a Hugging Face output
    with logits, its loss and logits fields (in order); anything else whole."""
    keys = list(output.keys()) if hasattr(output, "to_tuple") else []
    if not _has_logits(keys):
        return output
    return tuple(output[k] for k in keys if _is_prediction(k))


class SpecInferenceError(ValueError):
    """A module cannot be traced, or its inferred symmetries fail their check."""


@dataclass(frozen=True)
class TracedGraph:
    """The exported graph and what its placeholders are.

    Attributes:
        graph: the ATen graph (``torch.fx``).
        params: placeholder name -> state-dict key of a parameter or persistent buffer
            (the first key of tied weights: :func:`module_params` keeps only that one).
        aliases: state-dict key -> the other keys tied to it.
        statistics: state-dict keys that are buffers (running statistics): they move
            with their space but are not compared by weight matching.
        constants: placeholder names of lifted constants and non-persistent buffers.
        inputs: placeholder names of the user inputs, in order.
        shapes: state-dict key -> shape.
        outputs: positions, among the graph's outputs, of those the function is judged
            by (:func:`prediction`); None: all of them.
        indices: placeholder name -> value of each small integer constant (an index
            list written in the model's code, ``x[..., [-2], :]``): rules read which
            entries it takes.
    """

    graph: Graph
    params: Mapping[str, str]
    aliases: Mapping[str, tuple[str, ...]]
    statistics: frozenset[str]
    constants: frozenset[str]
    inputs: tuple[str, ...]
    shapes: Mapping[str, tuple[int, ...]]
    outputs: tuple[int, ...] | None = None
    indices: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def unjudged(self) -> frozenset[str]:
        """Names of the nodes the graph returns only as outputs the function is not
        judged by (:func:`prediction`: an encoder's last hidden state beside logits)."""
        if self.outputs is None:
            return frozenset()
        node = next(n for n in self.graph.nodes if n.op == "output")
        returned = list(node.args[0])  # positions as in ``outputs`` (constants included)
        judged = {returned[i].name for i in self.outputs if isinstance(returned[i], Node)}
        return frozenset(a.name for a in returned if isinstance(a, Node) and a.name not in judged)


def module_path(node: Node) -> str:
    """Qualified name of the innermost module that ran ``node`` (``""``: the root)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path, _cls = list(stack.values())[-1]
    return str(path)


def _aliases(module: nn.Module) -> dict[str, tuple[str, ...]]:
    """State-dict key -> every key sharing its tensor (tied weights), itself first."""
    by_id: dict[int, list[str]] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        by_id.setdefault(id(tensor), []).append(name)
    return {name: tuple(names) for names in by_id.values() for name in names}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # export warns about things that do not concern a user of lmckit (deprecated
    # internals of transformers, constant folding); errors still surface, as the one-line
    # SpecInferenceError. PyTorch also logs an error's whole traceback on stderr ("failed
    # while attempting to run meta for aten.mm") before raising it: its loggers are held
    # above CRITICAL while exporting (a logger a user set to a level of its own is left so)
    torch_logger = logging.getLogger("torch")
    level = torch_logger.level
    torch_logger.setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch_logger.setLevel(level)


def trace(
    module: nn.Module,
    example_inputs: Sequence[Any],
    *,
    kwargs: Mapping[str, Any] | None = None,
) -> TracedGraph:
    """Export ``module`` (in eval mode) on ``example_inputs``.

    Raises:
        TypeError: inputs ``module.forward`` cannot take (its signature named).
        SpecInferenceError: the module does not trace, naming the reason.
    """
    if not isinstance(module, nn.Module):
        held = next((a for a in ("model", "module") if isinstance(getattr(module, a, None),
                                                                   nn.Module)), None)  # fmt: skip
        hint = f": pass its .{held}" if held else ""
        raise SpecInferenceError(f"expected an nn.Module, got {type(module).__name__}{hint}")
    bind_inputs(module, example_inputs, kwargs or {})
    was_training = module.training
    module.eval()
    name = type(module).__name__
    try:
        with _quiet(), torch.no_grad():
            program = torch.export.export(
                module, tuple(example_inputs), dict(kwargs or {}), strict=False
            )
    except Exception as err:  # export raises many types; all mean "does not trace"
        given = describe_inputs(example_inputs, kwargs or {})
        with _quiet():
            why = describe_failure(err, module, example_inputs, kwargs or {})
        raise SpecInferenceError(f"cannot trace {name} on {given}: {why}") from None
    finally:
        module.train(was_training)
    aliases = _aliases(module)
    state = module.state_dict()
    params: dict[str, str] = {}
    statistics: set[str] = set()
    constants: set[str] = set()
    indices: dict[str, tuple[int, ...]] = {}
    inputs: list[str] = []
    kinds = torch.export.graph_signature.InputKind
    for spec in program.graph_signature.input_specs:
        placeholder = spec.arg.name if hasattr(spec.arg, "name") else str(spec.arg)
        if spec.kind == kinds.USER_INPUT:
            inputs.append(placeholder)
        elif spec.kind in (kinds.PARAMETER, kinds.BUFFER) and spec.target in state:
            key = aliases.get(spec.target, (spec.target,))[0]
            params[placeholder] = key
            if spec.kind == kinds.BUFFER:
                statistics.add(key)
        else:
            constants.add(placeholder)
            value = program.constants.get(spec.target) if spec.target else None
            if isinstance(value, torch.Tensor) and _is_index_list(value):
                indices[placeholder] = tuple(int(i) for i in value.reshape(-1).tolist())
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    tied = {names[0]: names[1:] for names in aliases.values() if len(names) > 1}
    return TracedGraph(
        program.graph,
        params,
        tied,
        frozenset(statistics),
        frozenset(constants),
        tuple(inputs),
        shapes,
        _predicted(program),
        indices,
    )


#: the most entries an integer constant may have to be kept as an index list
MAX_INDEX_LIST = 4096


def _is_index_list(value: torch.Tensor) -> bool:
    return (
        value.ndim <= 1
        and not value.is_floating_point()
        and value.dtype != torch.bool
        and value.numel() <= MAX_INDEX_LIST
    )


def _predicted(program: Any) -> tuple[int, ...] | None:
    """Positions among the graph's outputs of the user outputs :func:`prediction`
    keeps, or None (all of them)."""
    spec = program.call_spec.out_spec
    keys = spec.context if spec is not None and isinstance(spec.context, list) else []
    if not _has_logits(keys):
        return None
    kinds = torch.export.graph_signature.OutputKind
    user = [i for i, o in enumerate(program.graph_signature.output_specs)
            if o.kind == kinds.USER_OUTPUT]  # fmt: skip
    keep: list[int] = []
    start = 0
    children = spec.children() if hasattr(spec, "children") else spec.children_specs
    for key, child in zip(keys, children, strict=True):
        if _is_prediction(key):
            keep += [user[i] for i in range(start, start + child.num_leaves)]
        start += child.num_leaves
    return tuple(keep)
