"""From an analysed graph to a :class:`~lmckit.symmetry.SymmetrySpec`.

The graph's parameter axes are read as drafts of spaces (:mod:`lmckit.inference._drafts`: the
variable each axis moves, the variables nested in it or shared by all its units). Spaces
are then named, given a group from their level, probes (the inputs of the modules that
read them, for activation matching) and, for attention heads computed by projections,
their QK/OV circuits (:mod:`lmckit.inference._heads`). Nested spaces get one space per unit of
their parent (:class:`~lmckit.symmetry.Nest`); a basis that every head holds alike is one
space beside the heads, ``<heads>.value`` or ``<heads>.qk``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from lmckit.inference._analysis import Analysis
from lmckit.inference._drafts import Inner, LooseBasis, SpaceDraft, read_drafts, settle
from lmckit.inference._heads import head_circuits
from lmckit.inference._lattice import Level, Var
from lmckit.inference._nesting import batched_by, head_kinds
from lmckit.inference._probes import probes
from lmckit.symmetry._transform import (
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

__all__ = ["Candidate", "Emitted", "emit_spaces"]


@dataclass(frozen=True)
class Candidate:
    """Nested spaces the graph alone cannot decide (a query/key basis that rotary
    positions pin): the same uses in every unit of ``parent``, one group to be chosen
    by checking the function (:mod:`lmckit.inference._qk_basis`).

    Attributes:
        parent: the head space.
        kind: what the spaces move (``"qk"``).
        units: one space per unit of the parent: the uses of each.
        size: the variable's size (the spaces' ``n`` before the group's layout).
        cuts: offsets where slices of the graph cut the variable's axis.
        shared: one space, the same for every unit of the parent (a multi-query
            attention's key head): ``units`` holds its uses alone.
    """

    parent: str
    kind: str
    units: tuple[tuple[Use, ...], ...]
    size: int
    cuts: tuple[int, ...]
    #: one space for all the parent's units (``units`` holds its uses), not nested
    shared: bool = False
    #: the spaces nest in the parent (False: the parent is heads whose order is fixed,
    #: and there is one space per head, nested in none)
    nested: bool = True
    #: a norm's weight that every unit shares scales the basis, and is no use of it: only
    #: groups that keep such scales as they are may be proposed
    scaled: bool = False


@dataclass(frozen=True)
class Emitted:
    """What :func:`emit_spaces` read off the graph: the spaces, and candidates."""

    spaces: list[Space]
    candidates: list[Candidate]


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


def _nested_uses(size: int, places: list[Inner], units: int, unit: int) -> list[Use]:
    """The uses of a nested variable of ``size`` units inside unit ``unit`` of ``units``:
    per outer block of each axis, the slice that unit holds, laid out
    ``(middle, var, after)``."""
    uses = []
    for p in places:
        span = p.unit_span or p.middle * size * p.after
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
    parent: str,
    draft: SpaceDraft,
    kinds: Mapping[int, str],
    circuits: HeadCircuits | None,
) -> list[Space]:
    """One space per unit of ``parent`` for each variable nested in it (but heads whose
    order is fixed: the query heads of a group, under ALiBi)."""
    units = draft.var.size
    out = []
    taken: set[str] = set()
    for var, places in draft.inner.values():
        if var.fixed:
            continue
        base = "query" if var.heads else kinds.get(id(var), "units")
        kind, k = base, 1
        while kind in taken:  # two variables of one kind in a unit (extra projections)
            kind, k = f"{base}{k}", k + 1
        taken.add(kind)
        for unit in range(units):
            group, n, uses = _group(var, _nested_uses(var.size, places, units, unit))
            out.append(
                Space(
                    f"{parent}.{kind}.{unit}",
                    n,
                    group,
                    tuple(uses),
                    circuits=circuits if var.heads else None,
                    nest=Nest(parent, unit, kind),
                )
            )
    return out


def _fixed_heads(
    an: Analysis, name: str, draft: SpaceDraft, kinds: Mapping[int, str]
) -> tuple[list[Space], list[Candidate]]:
    """Heads whose order a constant fixes are no space, but the bases inside each head
    still move head by head (they are batched by the heads): one space per head, nested
    in none, and the query/key bases to propose likewise."""
    an.note(
        f"{name} ({draft.var.size} heads): their order is fixed by a constant that differs "
        f"from head to head ({draft.var.fixed}); the bases inside each head are kept, one "
        "space per head"
    )
    inner = _nested_spaces(name, draft, kinds, None)
    inner = [replace(s, nest=None, inside=s.nest) for s in inner]
    proposed = [replace(c, nested=False) for c in _candidates(an, name, draft)]
    return inner, proposed


def _candidates(an: Analysis, parent: str, draft: SpaceDraft) -> list[Candidate]:
    units = draft.var.size
    out = []
    for k, (size, places, factors) in enumerate(_whole_bases(list(draft.pending.values()))):
        cuts = sorted({cut for v, cut in an.cuts if an.lattice.find(v) in factors})
        per_unit = tuple(tuple(_nested_uses(size, places, units, u)) for u in range(units))
        kind = "qk" if k == 0 else f"qk{k}"  # two bases in one head: each its own name
        scaled = any(id(v) in draft.scaled for v in factors)
        out.append(Candidate(parent, kind, per_unit, size, tuple(cuts), scaled=scaled))
    return out


def _whole_bases(
    pending: list[tuple[Var, list[Inner]]],
) -> list[tuple[int, list[Inner], list[Var]]]:
    """The query/key bases to propose: ``(size, places, factors)``. Consecutive factors of
    one head dimension (interleaved rotary embeddings view it as ``(planes, 2)``, which
    splits its variable in two) are one basis: their product, laid out where they are."""
    bases = [(var.size, list(places), [var]) for var, places in pending]
    merged = True
    while merged:
        merged = False
        for i, j in ((i, j) for i in range(len(bases)) for j in range(len(bases)) if i != j):
            joined = _adjacent(bases[i], bases[j])
            if joined is not None:
                first, second = bases[i], bases[j]
                bases = [b for b in bases if b is not first and b is not second] + [joined]
                merged = True
                break
    return bases


def _adjacent(
    a: tuple[int, list[Inner], list[Var]], b: tuple[int, list[Inner], list[Var]]
) -> tuple[int, list[Inner], list[Var]] | None:
    """``a`` and ``b`` as one basis when ``b`` comes right after ``a`` on every axis they
    live on (``a``'s ``after`` is ``b``'s extent), else None."""
    size_a, places_a, vars_a = a
    size_b, places_b, vars_b = b
    if len(places_a) != len(places_b):
        return None
    joined = []
    for pa, pb in zip(places_a, places_b, strict=True):
        same = replace(pb, middle=pa.middle, after=pa.after)
        if same != pa or pa.after != size_b * pb.after or pb.middle != pa.middle * size_a:
            return None
        joined.append(replace(pa, after=pb.after))
    return size_a * size_b, joined, vars_a + vars_b


def emit_spaces(an: Analysis, names: Mapping[str, str] | None = None) -> Emitted:
    """The spaces of an analysed graph (see the module docstring), and the nested
    spaces to propose that only a check of the function can decide."""
    together = batched_by(an)
    settle(an, together)
    kinds = head_kinds(an)
    drafts, loose = read_drafts(an, together, kinds, batched_by(an, but_scales=True))
    circuits = head_circuits(an)
    spaces: list[Space] = []
    candidates: list[Candidate] = []
    taken: set[str] = set()
    shared = [d for d in drafts if d.var.residual and not d.var.heads]
    head_count = 0
    by_unit: dict[int, str] = {}
    fixed: set[str] = set()  # heads whose order is fixed: no space of their own
    for draft in drafts:
        if draft.shared_in is not None:
            continue  # named after its head space, below
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
        by_unit[id(draft.var)] = name
        if draft.var.heads and draft.var.fixed:
            fixed.add(name)
            inner, proposed = _fixed_heads(an, name, draft, kinds)
            spaces += inner
            candidates += proposed
            continue
        head = None
        if draft.var.heads:
            head = next((circuits[u.param] for u in uses if u.param in circuits), None)
        space = Space(name, n, group, tuple(uses), tuple(probes(an, draft.var, n)), head)
        spaces.append(space)
        spaces += _nested_spaces(name, draft, kinds, head)
        candidates += _candidates(an, name, draft)
    _insert_alike_spaces(drafts, by_unit, kinds, fixed, taken, spaces)
    _add_loose_candidates(an, loose, by_unit, fixed, candidates)
    return Emitted(spaces, candidates)


def _insert_alike_spaces(
    drafts: list[SpaceDraft],
    by_unit: dict[int, str],
    kinds: Mapping[int, str],
    fixed: set[str],
    taken: set[str],
    spaces: list[Space],
) -> None:
    """The bases shared by every unit of a head space, each inserted after its parent's
    family (inside the heads when their order is fixed, else within them)."""
    for draft in drafts:
        parent = by_unit.get(id(draft.shared_in)) if draft.shared_in is not None else None
        if parent is not None:
            group, n, uses = _group(draft.var, draft.uses)
            kind = kinds.get(id(draft.var), "units")
            name = base = f"{parent}.{kind}"
            while name in taken:  # two bases of one kind (extra projections)
                name = f"{base}{len(taken)}"
            taken.add(name)
            family = [i for i, s in enumerate(spaces) if s.name == parent or (
                s.nest is not None and s.nest.parent == parent)]  # fmt: skip
            at = family[-1] if family else len(spaces) - 1
            if parent in fixed:  # alike in every head, and no head space to commute with
                alike = Space(name, n, group, tuple(uses), inside=Nest(parent, None, kind))
            else:
                alike = Space(name, n, group, tuple(uses), within=parent)
            spaces.insert(at + 1, alike)


def _add_loose_candidates(
    an: Analysis,
    loose: list[LooseBasis],
    by_unit: dict[int, str],
    fixed: set[str],
    candidates: list[Candidate],
) -> None:
    """The pinned query/key bases that heads share, proposed like nested ones."""
    for lo in loose:
        parent = by_unit.get(id(lo.heads))
        if parent is not None:
            cuts = sorted({cut for v, cut in an.cuts if an.lattice.find(v) is lo.var})
            units = (tuple(lo.uses),)
            k = sum(c.parent == parent and c.shared for c in candidates)
            kind = "qk" if k == 0 else f"qk{k}"
            nested = parent not in fixed
            candidates.append(
                Candidate(parent, kind, units, lo.var.size, tuple(cuts), True, nested)
            )
