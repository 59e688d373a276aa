"""From an analysed graph to a :class:`~lmckit.symmetry.SymmetrySpec`.

Each parameter axis is read as its factors (leaf variables). Its outermost live
(unpinned) variable is the axis's space: the factors before it are the use's ``outer``
blocks, the ones after it its ``inner`` extent. Live variables inside it become *nested*
spaces, one per unit of the outer one (:class:`~lmckit.symmetry.Nest`), when they are
batched by it (:mod:`lmckit.spec.nesting`): the query heads of each key/value group, the
value basis and the query/key basis of each head. Each nested use lives in the slice of
the parameter that its unit holds (:class:`~lmckit.symmetry.Part`). An inner live
variable that is not batched by the outer one (the same for every unit) is pinned: a
parameter axis carries one space per level of nesting.

Spaces are then named, given a group from their level, probes (the inputs of the
modules that read them, for activation matching) and, for attention heads computed by
projections, their QK/OV circuits (:mod:`lmckit.spec.heads`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from lmckit.spec.analysis import Analysis, Role
from lmckit.spec.heads import head_circuits
from lmckit.spec.lattice import Level, Var
from lmckit.spec.nesting import batched_by, head_kinds, nests
from lmckit.spec.probes import probes
from lmckit.symmetry import (
    CenteredOrthogonal,
    Group,
    HeadCircuits,
    HeadPermutation,
    Nest,
    Orthogonal,
    Part,
    Permutation,
    Space,
    Use,
)

__all__ = ["SpaceDraft", "emit_spaces"]

_ROLE_ORDER: tuple[Role, ...] = ("write", "read", "elementwise")


@dataclass(frozen=True)
class _Inner:
    """Where a nested variable sits on one parameter axis: the axis (narrowed by ``pre``)
    is ``(outer, units, ...)`` with the parent's ``units`` of ``unit_span`` entries each;
    inside a unit (narrowed by ``piece``, a block of a cut variable) the layout is
    ``(middle, var, after)``."""

    param: str
    axis: int
    role: Role
    outer: int
    middle: int
    after: int
    compare: bool
    pre: tuple[Part, ...] = ()
    unit_span: int = 0
    piece: Part | None = None


@dataclass(frozen=True)
class _View:
    """A parameter axis, or the block of it that slices cut out (``parts``), read as the
    factor list ``leaves``."""

    parts: tuple[Part, ...]
    leaves: list[Var]


def _views(an: Analysis, var: Var, axis: int) -> list[_View]:
    """The views of a parameter axis: itself, or, when its leading variable was cut into
    blocks (a fused projection's query, key and value rows), one view per block."""
    return _expand(an, an.lattice.leaves([var]), axis, ())


def _expand(an: Analysis, leaves: list[Var], axis: int, parts: tuple[Part, ...]) -> list[_View]:
    blocks = an.lattice.pieces(leaves[0]) if leaves else None
    if blocks is None:
        return [_View(parts, leaves)]
    after = math.prod(v.size for v in leaves[1:])
    out: list[_View] = []
    for start, piece in blocks:
        inside = (*parts, Part(axis, start * after, piece.size * after))
        out += _expand(an, an.lattice.leaves([piece]) + leaves[1:], axis, inside)
    return out


def _is_live(an: Analysis, var: Var) -> bool:
    return var.level > Level.FREE and an.lattice.pieces(var) is None


def _live_leaves(an: Analysis, leaves: list[Var]) -> list[Var]:
    """The live variables of a view, in order: the blocks of a cut variable right after
    the first live one count as nested in it."""
    out: list[Var] = []
    for at, leaf in enumerate(leaves):
        blocks = an.lattice.pieces(leaf)
        if blocks is None:
            if leaf.level > Level.FREE and leaf not in out:
                out.append(leaf)
        elif out and at > 0 and leaves[at - 1] is out[0]:
            for _, piece in blocks:
                out += [v for v in an.lattice.leaves([piece]) if _is_live(an, v) and v not in out]
    return out


@dataclass
class SpaceDraft:
    """A space before naming: its leaf variable and the uses found for it; for nested
    variables, their places inside each unit of this space."""

    var: Var
    uses: list[Use]
    order: int
    inner: dict[int, tuple[Var, list[_Inner]]] = field(default_factory=dict)
    #: pinned query/key variables batched by this space: nested spaces to propose
    pending: dict[int, tuple[Var, list[_Inner]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    """Nested spaces the graph alone cannot decide (a query/key basis that rotary
    positions pin): the same uses in every unit of ``parent``, one group to be chosen
    by checking the function (:mod:`lmckit.spec.qk_basis`).

    Attributes:
        parent: the head space.
        kind: what the spaces move (``"qk"``).
        units: one space per unit of the parent: the uses of each.
        size: the variable's size (the spaces' ``n`` before the group's layout).
        cuts: offsets where slices of the graph cut the variable's axis.
    """

    parent: str
    kind: str
    units: tuple[tuple[Use, ...], ...]
    size: int
    cuts: tuple[int, ...]


@dataclass(frozen=True)
class Emitted:
    """What :func:`emit_spaces` read off the graph: the spaces, and candidates."""

    spaces: list[Space]
    candidates: list[Candidate]


def _live(an: Analysis, views: list[_View]) -> list[Var]:
    """The live variables of every view of one parameter axis."""
    out: list[Var] = []
    for view in views:
        out += [v for v in _live_leaves(an, view.leaves) if v not in out]
    return out


def _settle(an: Analysis, together: dict[int, set[int]]) -> None:
    """Pin until every used parameter axis holds one live variable (with a role) and
    variables nested in it."""
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
                views = _views(an, var, i)
                live = _live(an, views)
                if live and not an.roles.get((key, i)):
                    an.note(f"{key} (axis {i}) is used in a way lmckit does not understand")
                    an.lattice.pin(live, f"{key} axis {i}: unknown use")
                    changed = True
                    continue
                for view in views:
                    here = _live_leaves(an, view.leaves)
                    stray = [v for v in here[1:] if not nests(an, here[0], v, together)]
                    if stray:
                        an.lattice.pin(stray, "one space per parameter axis (heads kept)")
                        changed = True


def _drafts(
    an: Analysis, together: dict[int, set[int]], kinds: Mapping[int, str]
) -> list[SpaceDraft]:
    drafts: dict[int, SpaceDraft] = {}
    traced = an.traced
    for order, (key, axes) in enumerate(an.param_vars.items()):
        for i, var in enumerate(axes):
            if not an.roles.get((key, i)):
                continue
            roles = an.roles[(key, i)]
            role = next(r for r in _ROLE_ORDER if r in roles)
            compare = key not in traced.statistics
            for view in _views(an, var, i):
                live = _live_leaves(an, view.leaves)
                if not live:
                    continue
                unit, leaves = live[0], view.leaves
                pos = leaves.index(unit)
                outer = math.prod(v.size for v in leaves[:pos])
                span = math.prod(v.size for v in leaves[pos + 1 :])
                draft = drafts.setdefault(id(unit), SpaceDraft(unit, [], order))
                draft.uses.append(Use(key, i, role, outer, span, compare, view.parts))
                here = _Inner(key, i, role, outer, 1, 1, compare, view.parts, span)
                for place in _children(an, leaves, pos):
                    child, middle, after, piece = place
                    if child in live:
                        found = draft.inner
                    elif kinds.get(id(child)) == "qk" and nests(an, unit, child, together):
                        found = draft.pending  # pinned by positions: check decides
                    else:
                        continue
                    _, places = found.setdefault(id(child), (child, []))
                    places.append(replace(here, middle=middle, after=after, piece=piece))
    return sorted(drafts.values(), key=lambda d: d.order)


def _children(an: Analysis, leaves: list[Var], pos: int) -> list[tuple[Var, int, int, Part | None]]:
    """The variables inside each unit of ``leaves[pos]``: ``(var, middle, after, piece)``,
    the layout ``(middle, var, after)`` of the unit, or of its block ``piece`` when the
    variable right after the unit was cut into blocks."""
    out: list[tuple[Var, int, int, Part | None]] = []
    for at, child in enumerate(leaves[pos + 1 :], start=pos + 1):
        middle = math.prod(v.size for v in leaves[pos + 1 : at])
        after = math.prod(v.size for v in leaves[at + 1 :])
        blocks = an.lattice.pieces(child)
        if blocks is None:
            out.append((child, middle, after, None))
        elif at == pos + 1:
            for start, block in blocks:
                piece = Part(0, start * after, block.size * after)
                inside = an.lattice.leaves([block])
                for k, var in enumerate(inside):
                    before = math.prod(v.size for v in inside[:k])
                    rest = math.prod(v.size for v in inside[k + 1 :]) * after
                    out.append((var, before, rest, piece))
    return out


def _group(unit: Var, uses: list[Use]) -> tuple[Group, int, list[Use]]:
    """The space's group, its size ``n`` and its uses in that group's layout."""
    inners = {u.inner for u in uses}
    if unit.heads and len(inners) == 1 and (head_dim := inners.pop()) > 1:
        flat = [Use(u.param, u.axis, u.role, u.outer, 1, u.compare, u.parts) for u in uses]
        return HeadPermutation(unit.size, head_dim), unit.size * head_dim, flat
    if unit.level == Level.ORTH and not unit.heads:
        return Orthogonal(), unit.size, uses
    if unit.level == Level.CENTERED and not unit.heads:
        return CenteredOrthogonal(), unit.size, uses
    return Permutation(blocks=unit.blocks), unit.size, uses


def _nested_uses(var: Var, places: list[_Inner], units: int, unit: int) -> list[Use]:
    """The uses of nested variable ``var`` inside unit ``unit`` of ``units``: per outer
    block of each axis, the slice that unit holds, laid out ``(middle, var, after)``."""
    uses = []
    for p in places:
        span = p.unit_span or p.middle * var.size * p.after
        piece = () if p.piece is None else (Part(p.axis, p.piece.start, p.piece.length),)
        for block in range(p.outer):
            parts = (*p.pre, Part(p.axis, (block * units + unit) * span, span), *piece)
            uses.append(Use(p.param, p.axis, p.role, p.middle, p.after, p.compare, parts))
    return uses


def _module_of(param: str) -> str:
    return param.rpartition(".")[0]


def _pattern(template: str) -> re.Pattern[str]:
    escaped = re.escape(template)
    return re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\d+)", escaped) + "$")


def _name(draft: SpaceDraft, names: Mapping[str, str], taken: set[str], shared: bool) -> str:
    writers = [u.param for u in draft.uses if u.role == "write"] or [draft.uses[0].param]
    base = None
    for template, hint in names.items():
        match = _pattern(template).match(_module_of(writers[0]))
        if match:
            base = hint.format(**match.groupdict())
            break
    if base is None and shared:
        return "residual"
    # one module may write several spaces (a one-head attention's query/key and value
    # bases): the second gets a suffix
    base = base or _module_of(writers[0]) or writers[0]
    name, k = base, 1
    while name in taken:
        name, k = f"{base}.{k}", k + 1
    return name


def _hinted(draft: SpaceDraft, names: Mapping[str, str]) -> bool:
    writers = [u.param for u in draft.uses if u.role == "write"] or [draft.uses[0].param]
    return any(_pattern(t).match(_module_of(writers[0])) for t in names)


def _nested_spaces(
    parent: Space,
    draft: SpaceDraft,
    kinds: Mapping[int, str],
    circuits: HeadCircuits | None,
) -> list[Space]:
    """One space per unit of ``parent`` for each variable nested in it."""
    units = draft.var.size
    out = []
    taken: set[str] = set()
    for var, places in draft.inner.values():
        base = "query" if var.heads else kinds.get(id(var), "units")
        kind, k = base, 1
        while kind in taken:  # two variables of one kind in a unit (extra projections)
            kind, k = f"{base}{k}", k + 1
        taken.add(kind)
        for unit in range(units):
            group, n, uses = _group(var, _nested_uses(var, places, units, unit))
            out.append(
                Space(
                    f"{parent.name}.{kind}.{unit}",
                    n,
                    group,
                    tuple(uses),
                    circuits=circuits if var.heads else None,
                    nest=Nest(parent.name, unit, kind),
                )
            )
    return out


def _candidates(an: Analysis, parent: Space, draft: SpaceDraft) -> list[Candidate]:
    units = draft.var.size
    out = []
    for var, places in draft.pending.values():
        cuts = sorted({cut for v, cut in an.cuts if an.lattice.find(v) is var})
        per_unit = tuple(tuple(_nested_uses(var, places, units, u)) for u in range(units))
        out.append(Candidate(parent.name, "qk", per_unit, var.size, tuple(cuts)))
    return out


def emit_spaces(an: Analysis, names: Mapping[str, str] | None = None) -> Emitted:
    """The spaces of an analysed graph (see the module docstring), and the nested
    spaces to propose that only a check of the function can decide."""
    together = batched_by(an)
    _settle(an, together)
    kinds = head_kinds(an)
    drafts = _drafts(an, together, kinds)
    circuits = head_circuits(an)
    spaces: list[Space] = []
    candidates: list[Candidate] = []
    taken: set[str] = set()
    shared = [d for d in drafts if d.var.residual and not d.var.heads]
    head_count = 0
    for draft in drafts:
        group, n, uses = _group(draft.var, draft.uses)
        is_shared = draft in shared
        if draft.var.heads:
            name = f"heads.{head_count}"
            head_count += 1
            if names and _hinted(draft, names):
                name = _name(draft, names, taken, False)
        else:
            name = _name(draft, names or {}, taken, is_shared)
            if is_shared and len(shared) > 1 and name == "residual":
                name = f"residual.{shared.index(draft)}"
        taken.add(name)
        head = None
        if draft.var.heads:
            head = next((circuits[u.param] for u in uses if u.param in circuits), None)
        space = Space(name, n, group, tuple(uses), tuple(probes(an, draft.var, n)), head)
        spaces.append(space)
        spaces += _nested_spaces(space, draft, kinds, head)
        candidates += _candidates(an, space, draft)
    return Emitted(spaces, candidates)
