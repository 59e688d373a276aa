"""Probes: where activation matching observes a space's features.

The input of a module that reads the space (a Linear's or Conv's input) holds exactly its
features; failing that, the output of a module that carries exactly the space on one
axis.
"""

from __future__ import annotations

import math

from torch.fx import Node

from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._graph import TRANSPARENT, op_name, stack
from lmckit.inference._lattice import Level, Var
from lmckit.inference._trace import module_path
from lmckit.symmetry._transform import Probe

__all__ = ["probes"]

_READERS = {"linear": 0, "addmm": 1, "conv1d": 0, "conv2d": 0, "conv3d": 0, "convolution": 0,
            "matmul": 0}  # fmt: skip


def _reads_a_weight(an: Analysis, node: Node) -> bool:
    """Whether a reader node multiplies its input by a parameter (``x @ W.T``, as
    Falcon's linear layers are written), not by another activation."""
    if op_name(node) != "matmul":
        return True
    other = an.values.get(node.args[1].name) if isinstance(node.args[1], Node) else None
    return isinstance(other, Value) and any(other.src)


def _module_input(node: Node, module: str) -> Node | None:
    """The value entering ``module`` that ``node`` (inside it) reads, through views."""
    source = node.args[_READERS[op_name(node)]]
    while isinstance(source, Node) and module in stack(source):
        if op_name(source) not in TRANSPARENT:
            return None
        source = source.args[0]
    return source if isinstance(source, Node) else None


def _calls(an: Analysis) -> dict[str, set[str]]:
    """Module path -> the keys of its calls in the graph (``path@1`` for a second call)."""
    calls: dict[str, set[str]] = {}
    for node in an.traced.graph.nodes:
        for key, (path, _cls) in (node.meta.get("nn_module_stack") or {}).items():
            calls.setdefault(str(path), set()).add(str(key))
    return calls


def _call(node: Node) -> str:
    """The key of the call of the innermost module that ran ``node``."""
    return str(list((node.meta.get("nn_module_stack") or {"": None}).keys())[-1])


class _Seen:
    """Per module, what each of its calls shows of the space: the probe (one axis for
    every call) and the calls that show it."""

    def __init__(self, calls: dict[str, set[str]]) -> None:
        self.calls = calls
        self.probe: dict[str, Probe | None] = {}
        self.seen: dict[str, set[str]] = {}

    def note(self, probe: Probe, call: str) -> None:
        """``call`` of ``probe.module`` shows the space as ``probe`` (its first sight
        per call counts; another axis at another call: no probe)."""
        seen = self.seen.setdefault(probe.module, set())
        if call in seen:
            return
        first = self.probe.setdefault(probe.module, probe)
        self.probe[probe.module] = first if first == probe else None
        seen.add(call)

    def valid(self, module: str) -> bool:
        """Whether every call of ``module`` shows the space alike: a module run at several
        places (one layer's weights used by several layers) is a probe only then, and
        activation matching pools the samples of its calls."""
        found = self.probe.get(module)
        return found is not None and self.seen[module] == self.calls.get(module)


def probes(an: Analysis, unit: Var, n: int) -> list[Probe]:
    """Inputs of the modules that read this space (a Linear's or Conv's input)."""
    seen = _Seen(_calls(an))
    for node in an.traced.graph.nodes:
        if node.op != "call_function" or op_name(node) not in _READERS:
            continue
        if not _reads_a_weight(an, node):
            continue
        module = module_path(node)
        if not module:
            continue  # the root
        source = _module_input(node, module)
        value = an.values.get(source.name) if source is not None else None
        if not isinstance(value, Value) or not value.axes:
            continue
        conv = op_name(node).startswith("conv")
        axis = value.ndim - node.args[1].meta["val"].ndim + 1 if conv else value.ndim - 1
        leaves = an.lattice.leaves(value.axes[axis])
        live = [v for v in leaves if v.level > Level.FREE]
        # the space's units first, each a contiguous block (grouped-query heads: a key
        # head's query heads); activation matching compares the blocks feature by feature
        # (variables nested in the unit's blocks may follow it: they move within blocks)
        if not live or leaves[0] is not unit or math.prod(v.size for v in leaves) % n:
            continue
        seen.note(Probe(module, axis - value.ndim, input=True), _call(node))
    found = [p for m, p in seen.probe.items() if p is not None and seen.valid(m)]
    return found or _output_probes(an, unit, n, seen.calls)


def _output_probes(an: Analysis, unit: Var, n: int, calls: dict[str, set[str]]) -> list[Probe]:
    """Outputs of modules that carry exactly this space on one axis: per node, the
    innermost module it leaves that carries it so at every call."""
    seen = _Seen(calls)
    candidates: list[list[Probe]] = []
    for node in an.traced.graph.nodes:
        value = an.values.get(node.name)
        if node.op != "call_function" or not isinstance(value, Value):
            continue
        stack = node.meta.get("nn_module_stack") or {}
        exits = [
            (str(path), str(key))
            for key, (path, _cls) in stack.items()
            if path and any(key not in (u.meta.get("nn_module_stack") or {}) for u in node.users)
        ]
        for axis in range(value.ndim):
            leaves = an.lattice.leaves(value.axes[axis])
            if exits and leaves and leaves[0] is unit and math.prod(v.size for v in leaves) == n:
                here = [Probe(path, axis - value.ndim) for path, _ in exits[::-1]]
                for probe, (_, call) in zip(here, exits[::-1], strict=True):
                    seen.note(probe, call)
                candidates.append(here)
    found: dict[str, Probe] = {}
    for here in candidates:
        first = next((p for p in here if seen.valid(p.module)), None)
        if first is not None:
            found.setdefault(first.module, first)
    return list(found.values())
