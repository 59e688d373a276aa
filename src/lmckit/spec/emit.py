"""From an analysed graph to a :class:`~lmckit.symmetry.SymmetrySpec`.

Each parameter axis whose factors hold exactly one live (unpinned) variable uses that
variable's space: the factors before it are the use's ``outer`` blocks, the ones after
its ``inner`` extent. Where an axis holds several live variables (a query projection's
rows are heads times within-head units) the outermost is kept and the others pinned:
the algebra gives one space per parameter axis, and whole heads are what the rest of
lmckit aligns. Spaces are then named, given a group from their level, probes (the
inputs of the modules that read them, for activation matching) and, for attention
heads computed by plain linear projections, their QK/OV circuits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from torch.fx import Node

from lmckit.spec.analysis import Analysis, Role, Value
from lmckit.spec.lattice import Level, Var
from lmckit.spec.trace import module_path
from lmckit.symmetry import (
    CircuitPart,
    Group,
    HeadCircuits,
    HeadPermutation,
    Orthogonal,
    Permutation,
    Probe,
    Space,
    Use,
)

__all__ = ["SpaceDraft", "emit_spaces"]

_ROLE_ORDER: tuple[Role, ...] = ("write", "read", "elementwise")


@dataclass
class SpaceDraft:
    """A space before naming: its leaf variable and the uses found for it."""

    var: Var
    uses: list[Use]
    order: int


def _live(an: Analysis, var: Var) -> list[Var]:
    return [v for v in an.lattice.leaves([var]) if v.level > Level.FREE]


def _settle(an: Analysis) -> None:
    """Pin until every used parameter axis has at most one live variable, with a role."""
    used = {
        an.traced.params[n.name]
        for n in an.traced.graph.nodes
        if n.op == "placeholder" and n.users and n.name in an.traced.params
    }
    changed = True
    while changed:
        changed = False
        for key, axes in an.param_vars.items():
            if key not in used:
                continue
            for i, var in enumerate(axes):
                live = _live(an, var)
                if len(live) > 1:
                    an.lattice.pin(live[1:], "one space per parameter axis (heads kept)")
                    changed = True
                elif live and not an.roles.get((key, i)):
                    an.note(f"{key} (axis {i}) is used in a way lmckit does not understand")
                    an.lattice.pin(live, f"{key} axis {i}: unknown use")
                    changed = True


def _drafts(an: Analysis) -> list[SpaceDraft]:
    drafts: dict[int, SpaceDraft] = {}
    traced = an.traced
    for order, (key, axes) in enumerate(an.param_vars.items()):
        for i, var in enumerate(axes):
            live = _live(an, var)
            if len(live) != 1 or not an.roles.get((key, i)):
                continue
            unit = live[0]
            leaves = an.lattice.leaves([var])
            pos = leaves.index(unit)
            outer = math.prod(v.size for v in leaves[:pos])
            inner = math.prod(v.size for v in leaves[pos + 1 :])
            roles = an.roles[(key, i)]
            role = next(r for r in _ROLE_ORDER if r in roles)
            draft = drafts.setdefault(id(unit), SpaceDraft(unit, [], order))
            draft.uses.append(Use(key, i, role, outer, inner, key not in traced.statistics))
    return sorted(drafts.values(), key=lambda d: d.order)


def _group(draft: SpaceDraft) -> tuple[Group, int, list[Use]]:
    """The space's group, its size ``n`` and its uses in that group's layout."""
    unit, uses = draft.var, draft.uses
    inners = {u.inner for u in uses}
    if unit.heads and len(inners) == 1 and (head_dim := inners.pop()) > 1:
        flat = [Use(u.param, u.axis, u.role, u.outer, 1, u.compare) for u in uses]
        return HeadPermutation(unit.size, head_dim), unit.size * head_dim, flat
    if unit.level == Level.ORTH and not unit.heads:
        return Orthogonal(), unit.size, uses
    return Permutation(blocks=unit.blocks), unit.size, uses


def _module_of(param: str) -> str:
    return param.rpartition(".")[0]


def _pattern(template: str) -> re.Pattern[str]:
    escaped = re.escape(template)
    return re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\d+)", escaped) + "$")


def _name(draft: SpaceDraft, names: Mapping[str, str], taken: set[str], shared: bool) -> str:
    writers = [u.param for u in draft.uses if u.role == "write"] or [draft.uses[0].param]
    for template, name in names.items():
        match = _pattern(template).match(_module_of(writers[0]))
        if match:
            return name.format(**match.groupdict())
    if shared:
        return "residual"
    base = _module_of(writers[0]) or writers[0]
    name, k = base, 1
    while name in taken:
        name, k = f"{base}.{k}", k + 1
    return name


# --------------------------------------------------------------------------- probes


_TRANSPARENT = {
    "view", "reshape", "_unsafe_view", "transpose", "permute", "contiguous", "clone",
    "alias", "to", "_to_copy", "dropout", "detach", "unsqueeze", "squeeze", "t", "flatten",
}  # fmt: skip


def _op(node: Node) -> str:
    """``linear`` for ``aten.linear.default``, ``getitem`` for ``operator.getitem``."""
    target = getattr(node.target, "overloadpacket", node.target)
    return str(getattr(target, "__name__", target))


def _stack(node: Node) -> list[str]:
    stack = node.meta.get("nn_module_stack") or {}
    return [str(path) for path, _cls in stack.values()]


_READERS = {"linear": 0, "addmm": 1, "conv1d": 0, "conv2d": 0, "conv3d": 0, "convolution": 0}


def _module_input(node: Node, module: str) -> Node | None:
    """The value entering ``module`` that ``node`` (inside it) reads, through views."""
    source = node.args[_READERS[_op(node)]]
    while isinstance(source, Node) and module in _stack(source):
        if _op(source) not in _TRANSPARENT:
            return None
        source = source.args[0]
    return source if isinstance(source, Node) else None


def _probes(an: Analysis, unit: Var, n: int) -> list[Probe]:
    """Inputs of the modules that read this space (a Linear's or Conv's input)."""
    probes: dict[str, Probe] = {}
    calls: dict[str, set[str]] = {}
    for node in an.traced.graph.nodes:
        for key, (path, _cls) in (node.meta.get("nn_module_stack") or {}).items():
            calls.setdefault(str(path), set()).add(str(key))
    for node in an.traced.graph.nodes:
        if node.op != "call_function" or _op(node) not in _READERS:
            continue
        module = module_path(node)
        if not module or len(calls.get(module, ())) != 1:
            continue  # the root, or a module run at several places (it sees several spaces)
        source = _module_input(node, module)
        value = an.values.get(source.name) if source is not None else None
        if not isinstance(value, Value) or not value.axes:
            continue
        conv = _op(node).startswith("conv")
        axis = value.ndim - node.args[1].meta["val"].ndim + 1 if conv else value.ndim - 1
        leaves = an.lattice.leaves(value.axes[axis])
        live = [v for v in leaves if v.level > Level.FREE]
        # the space's units first, each a contiguous block (grouped-query heads: a key
        # head's query heads); activation matching compares the blocks feature by feature
        if live != [unit] or leaves[0] is not unit or math.prod(v.size for v in leaves) % n:
            continue
        probes.setdefault(module, Probe(module, axis - value.ndim, input=True))
    return list(probes.values()) or _output_probes(an, unit, n, calls)


def _output_probes(an: Analysis, unit: Var, n: int, calls: dict[str, set[str]]) -> list[Probe]:
    """Outputs of modules (run once) that carry exactly this space on one axis."""
    probes: dict[str, Probe] = {}
    for node in an.traced.graph.nodes:
        value = an.values.get(node.name)
        if node.op != "call_function" or not isinstance(value, Value):
            continue
        stack = node.meta.get("nn_module_stack") or {}
        exits = [
            str(path)
            for key, (path, _cls) in stack.items()
            if path
            and len(calls.get(str(path), ())) == 1
            and any(key not in (u.meta.get("nn_module_stack") or {}) for u in node.users)
        ]
        if not exits:
            continue
        for axis in range(value.ndim):
            leaves = an.lattice.leaves(value.axes[axis])
            if [v for v in leaves if v.level > Level.FREE] != [unit] or leaves[0] is not unit:
                continue
            if math.prod(v.size for v in leaves) == n:
                probes.setdefault(exits[-1], Probe(exits[-1], axis - value.ndim))
    return list(probes.values())


# --------------------------------------------------------------------------- circuits


def _back_to_linear(node: Node) -> tuple[Node, int, int] | None:
    """Walk back from an attention operand to the linear projection that made it."""
    block, blocks = 0, 1
    current: object = node
    while isinstance(current, Node):
        op = _op(current)
        if op == "linear":
            return current, block, blocks
        if op == "getitem":
            parent, index = current.args[0], current.args[1]
            if not isinstance(parent, Node) or _op(parent) not in ("split", "chunk"):
                return None
            if not isinstance(index, int):
                return None
            block, blocks = index, len(parent.meta["val"])
            current = parent.args[0]
        elif op in _TRANSPARENT or op in ("split", "chunk"):
            current = current.args[0]
        else:
            return None
    return None


def _forward_to_linear(node: Node) -> Node | None:
    while len(node.users) == 1:
        (node,) = node.users
        if _op(node) == "linear":
            return node
        if _op(node) not in _TRANSPARENT:
            return None
    return None


def _circuits(an: Analysis) -> dict[str, HeadCircuits]:
    """Query weight key -> the head circuits of every attention computed by projections."""
    nodes = {n.name: n for n in an.traced.graph.nodes}
    params = an.traced.params
    out: dict[str, HeadCircuits] = {}
    for site in an.attention:
        found = [_back_to_linear(nodes[name]) for name in (site.query, site.key, site.value)]
        output = _forward_to_linear(nodes[site.node])
        if any(f is None for f in found) or output is None:
            continue
        parts: list[CircuitPart] = []
        biases: list[CircuitPart | None] = []
        for linear, block, blocks in (f for f in found if f is not None):
            weight, bias = linear.args[1], (linear.args[2] if len(linear.args) > 2 else None)
            if not isinstance(weight, Node) or weight.name not in params:
                break
            parts.append(CircuitPart(params[weight.name], block, blocks))
            if isinstance(bias, Node) and bias.name in params:
                biases.append(CircuitPart(params[bias.name], block, blocks))
            else:
                biases.append(None)
        out_weight = output.args[1]
        if len(parts) != 3 or not isinstance(out_weight, Node) or out_weight.name not in params:
            continue
        out[parts[0].param] = HeadCircuits(
            parts[0], parts[1], parts[2], params[out_weight.name], *biases
        )
    return out


def emit_spaces(an: Analysis, names: Mapping[str, str] | None = None) -> list[Space]:
    """The spaces of an analysed graph (see the module docstring)."""
    _settle(an)
    drafts = _drafts(an)
    circuits = _circuits(an)
    spaces: list[Space] = []
    taken: set[str] = set()
    shared = [d for d in drafts if d.var.residual and not d.var.heads]
    head_count = 0
    for draft in drafts:
        group, n, uses = _group(draft)
        is_shared = draft in shared
        if isinstance(group, HeadPermutation) or draft.var.heads:
            name = f"heads.{head_count}"
            head_count += 1
            name = (
                _name(draft, names or {}, taken, False) if names and _hinted(draft, names) else name
            )
        else:
            name = _name(draft, names or {}, taken, is_shared)
            if is_shared and len(shared) > 1 and name == "residual":
                name = f"residual.{shared.index(draft)}"
        taken.add(name)
        head = None
        if isinstance(group, HeadPermutation):
            head = next((circuits[u.param] for u in uses if u.param in circuits), None)
        probes = tuple(_probes(an, draft.var, n))
        spaces.append(Space(name, n, group, tuple(uses), probes, head))
    return spaces


def _hinted(draft: SpaceDraft, names: Mapping[str, str]) -> bool:
    writers = [u.param for u in draft.uses if u.role == "write"] or [draft.uses[0].param]
    return any(_pattern(t).match(_module_of(writers[0])) for t in names)
