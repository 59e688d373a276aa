"""Parameter axes read as drafts of spaces: which variable each axis moves, and what
is nested in it.

Each parameter axis is read as its factors (leaf variables). Its outermost live
(unpinned) variable is the axis's space: the factors before it are the use's ``outer``
blocks, the ones after it its ``inner`` extent. Live variables inside it are nested in it
when they are batched by it (:mod:`lmckit.inference._nesting`), shared by all its units when
it is attention heads (a multi-query attention's key/value head), and pinned otherwise
(:func:`settle`). :func:`read_drafts` collects, per variable, the uses of the space it
will be (:class:`SpaceDraft`); :mod:`lmckit.inference._emit` names them and gives them groups.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from lmckit.inference._analysis import Analysis, Role
from lmckit.inference._lattice import Level, Var
from lmckit.inference._nesting import nests
from lmckit.symmetry._transform import Part, Use

__all__ = ["Inner", "LooseBasis", "SpaceDraft", "read_drafts", "settle"]

_ROLE_ORDER: tuple[Role, ...] = ("write", "read", "elementwise")


@dataclass(frozen=True)
class Inner:
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


def _unreached(an: Analysis, leaves: list[Var], live: list[Var]) -> list[Var]:
    """The live variables in blocks of a cut factor of a view that :func:`_live_leaves`
    does not reach (the factor is not right after the view's first live variable): a
    space of them would miss this parameter axis."""
    out: list[Var] = []
    for at, leaf in enumerate(leaves):
        blocks = an.lattice.pieces(leaf)
        if blocks is None or (live and at > 0 and leaves[at - 1] is live[0]):
            continue
        for _, piece in blocks:
            out += [v for v in an.lattice.leaves([piece]) if v.level > Level.FREE]
    return out


@dataclass
class SpaceDraft:
    """A space before naming: its leaf variable and the uses found for it; for nested
    variables, their places inside each unit of this space."""

    var: Var
    uses: list[Use]
    order: int
    inner: dict[int, tuple[Var, list[Inner]]] = field(default_factory=dict)
    #: pinned query/key variables batched by this space: nested spaces to propose
    pending: dict[int, tuple[Var, list[Inner]]] = field(default_factory=dict)
    #: of those, the ones a norm's weight shared by all units scales (nested only once
    #: that weight is not counted: see ``proposed`` in :func:`read_drafts`)
    scaled: set[int] = field(default_factory=set)
    #: for a variable every unit of a head space holds alike: that space's unit variable
    shared_in: Var | None = None


def _live(an: Analysis, views: list[_View]) -> list[Var]:
    """The live variables of every view of one parameter axis."""
    out: list[Var] = []
    for view in views:
        out += [v for v in _live_leaves(an, view.leaves) if v not in out]
    return out


def settle(an: Analysis, together: dict[int, set[int]]) -> None:
    """Pin until every used parameter axis holds one live variable (with a role),
    variables nested in it and, inside attention heads, factors all heads hold alike."""
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
                    hidden = _unreached(an, view.leaves, here)
                    if hidden:  # blocks no space of this axis holds: pinned, not missed
                        an.lattice.pin(hidden, "blocks of an axis after a pinned factor")
                        changed = True
                    stray = [v for v in here[1:] if not nests(an, here[0], v, together)]
                    if here and here[0].heads:
                        # a factor every head holds alike is a space of its own
                        stray = [v for v in stray if v not in view.leaves]
                    if stray:
                        an.lattice.pin(stray, "one space per parameter axis (heads kept)")
                        changed = True


@dataclass
class LooseBasis:
    """A pinned query/key variable that heads share (not batched by them): its uses, and
    the head variable whose units read it."""

    var: Var
    uses: list[Use] = field(default_factory=list)
    heads: Var | None = None


def read_drafts(
    an: Analysis,
    together: dict[int, set[int]],
    kinds: Mapping[int, str],
    proposed: dict[int, set[int]] | None = None,
) -> tuple[list[SpaceDraft], list[LooseBasis]]:
    """The drafts of every live variable of a parameter axis (in parameter order), and
    the pinned query/key bases that heads share, to be proposed like nested ones.

    ``together`` says which variables are batched by which
    (:func:`~lmckit.inference._nesting.batched_by`),
    ``kinds`` which are query/key or value features
    (:func:`~lmckit.inference._nesting.head_kinds`), ``proposed`` the same as ``together``
    but for a norm's weight (``but_scales``): which pinned query/key bases to propose
    per unit (default ``together``).
    """
    proposed = together if proposed is None else proposed
    drafts: dict[int, SpaceDraft] = {}
    loose: dict[int, LooseBasis] = {}
    traced = an.traced
    for order, (key, axes) in enumerate(an.param_vars.items()):
        for i, var in enumerate(axes):
            if not an.roles.get((key, i)):
                continue
            roles = an.roles[(key, i)]
            role = next(r for r in _ROLE_ORDER if r in roles)
            compare = key not in traced.statistics
            for view in _views(an, var, i):
                leaves = view.leaves
                whole = Use(key, i, role, 1, 1, compare, view.parts)
                _note_free_qk_uses(loose, kinds, leaves, whole)
                live = _live_leaves(an, view.leaves)
                if not live:
                    continue
                unit = live[0]
                pos = leaves.index(unit)
                outer = math.prod(v.size for v in leaves[:pos])
                span = math.prod(v.size for v in leaves[pos + 1 :])
                draft = drafts.setdefault(id(unit), SpaceDraft(unit, [], order))
                draft.uses.append(Use(key, i, role, outer, span, compare, view.parts))
                here = Inner(key, i, role, outer, 1, 1, compare, view.parts, span)
                for place in _children(an, leaves, pos):
                    child, middle, after, piece = place
                    nested = nests(an, unit, child, together)
                    if child in live and nested:
                        found = draft.inner
                    elif kinds.get(id(child)) == "qk" and nests(an, unit, child, proposed):
                        found = draft.pending  # pinned by positions: check decides
                        if not nested:
                            draft.scaled.add(id(child))
                    elif unit.heads and piece is not None and _pinned_qk(kinds, child, live):
                        # a block of every head's features that all heads share (the
                        # rotary key of multi-head latent attention): its rows in each head
                        basis = loose.setdefault(id(child), LooseBasis(child))
                        basis.uses += _per_unit(here, unit.size * outer, span, piece, place)
                        basis.heads = unit
                        continue
                    elif unit.heads and piece is None and (child in live or id(child) in loose):
                        # every head holds it alike: a space of its own beside the heads
                        if child in live:
                            other = drafts.setdefault(id(child), SpaceDraft(child, [], order))
                            other.shared_in = unit
                            outer_all = outer * unit.size * middle
                            use = Use(key, i, role, outer_all, after, compare, view.parts)
                            other.uses.append(use)
                        else:
                            loose[id(child)].heads = unit
                        continue
                    else:
                        continue
                    _, places = found.setdefault(id(child), (child, []))
                    places.append(replace(here, middle=middle, after=after, piece=piece))
    shared = [lo for lo in loose.values() if lo.heads is not None]
    return sorted(drafts.values(), key=lambda d: d.order), shared


def _note_free_qk_uses(
    loose: dict[int, LooseBasis], kinds: Mapping[int, str], leaves: Sequence[Var], use: Use
) -> None:
    """Record in ``loose`` each use of a free query/key basis among ``leaves``: ``use``
    with its outer and inner sizes set for that leaf's place."""
    for at, leaf in enumerate(leaves):
        if kinds.get(id(leaf)) == "qk" and leaf.level == Level.FREE:
            outer = math.prod(v.size for v in leaves[:at])
            after = math.prod(v.size for v in leaves[at + 1 :])
            placed = replace(use, outer=outer, inner=after)
            loose.setdefault(id(leaf), LooseBasis(leaf)).uses.append(placed)


def _pinned_qk(kinds: Mapping[int, str], var: Var, live: list[Var]) -> bool:
    """Whether ``var`` is a query/key basis that positions pin (no space of its own)."""
    return kinds.get(id(var)) == "qk" and var.level == Level.FREE and var not in live


def _per_unit(
    here: Inner, units: int, span: int, piece: Part, place: tuple[Var, int, int, Part | None]
) -> list[Use]:
    """The uses of block ``piece`` of each of ``units`` units of ``span`` entries along
    ``here``'s axis, laid out as ``place`` says (``(middle, var, after)`` in the block)."""
    _, middle, after, _ = place
    return [
        Use(here.param, here.axis, here.role, middle, after, here.compare,
            (*here.pre, Part(here.axis, u * span + piece.start, piece.length)))
        for u in range(units)
    ]  # fmt: skip


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
