"""The structural rules a spec's spaces obey, found as problems, one per offending space.

A :class:`~lmckit.symmetry.SymmetrySpec` refuses spaces that cannot act together: two
spaces of one name, a space nested in a space that does not move whole units (or is not
listed before it), nested spaces of one kind that are not one per unit of their parent,
and two spaces on one slice of a parameter axis that are not nested in each other (nor
alike in every unit of the other). :func:`structural_problems` lists every such problem
instead of stopping at the first: each names the space to set aside, and the spaces
after it are judged without it, so that a caller (symmetry inference) can leave out the
spaces in conflict and keep the rest. :func:`fit_problems` does the same for the fit of
the spaces to a parameter set (shapes, and elementwise parameters in groups that cannot
act on them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from lmckit.symmetry._spaces import Space, Use

__all__ = ["fit_problems", "structural_problems"]

#: ``(index of the space to set aside, why)``
Problem = tuple[int, str]
#: sets a space aside with its problem
Reject = Callable[[int, str], None]


def structural_problems(spaces: Sequence[Space]) -> list[Problem]:
    """Every structural problem of ``spaces`` in spec order (see the module docstring).

    Rules are applied in turn (names, nesting, families of nested spaces, overlaps), in
    the order found; a space with a problem is set aside, and the spaces nested in it
    get a problem of their own (a parent not listed). Judged greedily in spec order: of
    two spaces in conflict, the later one is named.
    """
    problems: list[Problem] = []
    out: set[int] = set()

    def reject(index: int, message: str) -> None:
        if index not in out:
            out.add(index)
            problems.append((index, message))

    names = [s.name for s in spaces]
    dupes = sorted({n for n in names if names.count(n) > 1})
    for i, name in enumerate(names):
        if name in dupes and names.index(name) != i:
            reject(i, f"duplicate space names: {dupes}")
    changed = True
    while changed:
        before = len(out)
        _nest_problems(spaces, out, reject)
        _family_problems(spaces, out, reject)
        _overlap_problems(spaces, out, reject)
        changed = len(out) > before
    return problems


def _nest_problems(spaces: Sequence[Space], out: set[int], reject: Reject) -> None:
    order = {s.name: i for i, s in enumerate(spaces) if i not in out}
    for i, space in enumerate(spaces):
        if i in out:
            continue
        if not space.uses:
            reject(i, f"space {space.name!r} has no uses")
            continue
        if space.nest is not None:
            message = _nest_problem(spaces, space, i, order)
            if message is not None:
                reject(i, message)


def _nest_problem(
    spaces: Sequence[Space], space: Space, at: int, order: Mapping[str, int]
) -> str | None:
    nest = space.nest
    assert nest is not None
    if nest.parent not in order or order[nest.parent] >= at:
        return (
            f"space {space.name!r} is nested in {nest.parent!r}, which is not a space "
            "listed before it"
        )
    parent = spaces[order[nest.parent]]
    if parent.nest is not None:
        return (
            f"space {space.name!r} is nested in {parent.name!r}, itself nested: "
            "spaces nest one level deep"
        )
    units = parent.group.units(parent.n)
    if units is None:
        return (
            f"space {space.name!r} is nested in {parent.name!r}, whose "
            f"{parent.group.name} group does not move whole units"
        )
    if nest.unit is None:
        if space.n != units:
            return (
                f"space {space.name!r} spans the units of {parent.name!r}: it needs "
                f"{units} units, not {space.n}"
            )
        return None
    if not 0 <= nest.unit < units:
        return (
            f"space {space.name!r} is nested in unit {nest.unit} of {parent.name!r}, "
            f"which has {units} units"
        )
    return None


def _family_problems(spaces: Sequence[Space], out: set[int], reject: Reject) -> None:
    """Each parent unit holds one space of each kind; a kind's spaces are alike."""
    by_name = {s.name: s for i, s in enumerate(spaces) if i not in out}
    families: dict[tuple[str, str], list[int]] = {}
    for i, space in enumerate(spaces):
        if i not in out and space.nest is not None:
            families.setdefault((space.nest.parent, space.nest.kind), []).append(i)
    for (parent, kind), members in families.items():
        nests = [spaces[i].nest for i in members]
        units = sorted(-1 if n is None or n.unit is None else n.unit for n in nests)
        if units == [-1]:
            continue  # one space spanning the parent's units
        owner = by_name[parent]
        if units != list(range(len(units))) or len(units) != owner.group.units(owner.n):
            for i in members:
                reject(
                    i,
                    f"nested spaces of kind {kind!r} in {parent!r} must be one per unit "
                    f"of it; units {units}",
                )
            continue
        first = spaces[members[0]]
        for i in members[1:]:
            other = spaces[i]
            if other.n != first.n or other.group != first.group:
                for j in members:
                    reject(
                        j,
                        f"nested spaces {first.name!r} and {other.name!r} of kind {kind!r} "
                        "differ in size or group",
                    )
                break


def _overlap_problems(spaces: Sequence[Space], out: set[int], reject: Reject) -> None:
    by_name = {s.name: s for i, s in enumerate(spaces) if i not in out}
    seen: dict[tuple[str, int], list[tuple[Space, Use]]] = {}
    for i, space in enumerate(spaces):
        if i in out:
            continue
        clash = None
        for use in space.uses:
            for other, other_use in seen.get((use.param, use.axis), []):
                if not (
                    _disjoint(use, other_use)
                    or _related(by_name, space, other)
                    or _alike_in_every_unit(space, use, other, other_use)
                ):
                    clash = (
                        f"axis {use.axis} of {use.param!r} is used by both "
                        f"{other.name!r} and {space.name!r}"
                    )
                    break
            if clash is not None:
                break
        if clash is not None:
            reject(i, clash)
            continue
        for use in space.uses:
            seen.setdefault((use.param, use.axis), []).append((space, use))


def _related(by_name: Mapping[str, Space], a: Space, b: Space) -> bool:
    """Whether ``a`` and ``b`` may share a slice of a parameter axis: one is nested
    (at any depth) in the other, or both are nested in (or inside) the same unit."""

    def chain(space: Space) -> list[str]:
        out = [space.name]
        while space.nest is not None and space.nest.parent in by_name:
            out.append(space.nest.parent)
            space = by_name[space.nest.parent]
        return out

    if a.name in chain(b) or b.name in chain(a):
        return True
    # nested in one unit (or inside one unit of heads whose order is fixed): they act on
    # different factors of what they share (the query heads of a group and the basis
    # inside each of them), and commute
    where_a, where_b = a.nest or a.inside, b.nest or b.inside
    return (
        where_a is not None
        and where_b is not None
        and (where_a.parent, where_a.unit) == (where_b.parent, where_b.unit)
    )


def _ranges(use: Use) -> dict[int, tuple[int, int]]:
    """Per part axis, the absolute ``[start, stop)`` range the use's parts select."""
    out: dict[int, tuple[int, int]] = {}
    for part in use.parts:
        lo = out.get(part.axis, (0, 0))[0] + part.start
        out[part.axis] = (lo, lo + part.length)
    return out


def _alike_in_every_unit(a: Space, use_a: Use, b: Space, use_b: Use) -> bool:
    """Whether ``a`` or ``b`` acts alike in every unit of the other (:attr:`Space.within`),
    laid out so on this axis: the two maps commute, so they may share the axis."""
    for mover, use_m, inside, use_i in ((a, use_a, b, use_b), (b, use_b, a, use_a)):
        units = mover.group.units(mover.n)
        if inside.within != mover.name or units is None or use_m.parts != use_i.parts:
            continue
        if (
            use_i.outer == use_m.outer * units
            and use_i.inner * inside.n * units == use_m.inner * mover.n
        ):
            return True
    return _in_one_unit(a, use_a, b, use_b) or _in_one_unit(b, use_b, a, use_a)


def _in_one_unit(mover: Space, use_m: Use, inside: Space, use_i: Use) -> bool:
    """Whether ``inside`` acts alike in every unit of ``mover`` through one use per unit
    on ``use_m``'s axis, each the same slice of its unit's entries (a block of every
    head's features: the rotary rows of multi-head latent attention), ``use_i`` one of
    them: the two maps commute."""
    units = mover.group.units(mover.n)
    if inside.within != mover.name or units is None or use_m.outer != 1:
        return False
    extent = use_m.inner * mover.n // units  # entries per unit

    def slot(use: Use) -> tuple[int, int, int] | None:  # (unit, offset in it, length)
        if use.parts[:-1] != use_m.parts or len(use.parts) != len(use_m.parts) + 1:
            return None
        last = use.parts[-1]
        if (use.param, use.axis, last.axis) != (use_m.param, use_m.axis, use_m.axis):
            return None
        unit, offset = divmod(last.start, extent)
        return (unit, offset, last.length) if offset + last.length <= extent else None

    if slot(use_i) is None:
        return False
    found = [slot(u) for u in inside.uses if u.param == use_m.param and u.axis == use_m.axis]
    slots = [f for f in found if f is not None]
    if len(slots) != len(found) or sorted(u for u, _, _ in slots) != list(range(units)):
        return False
    return len({(offset, length) for _, offset, length in slots}) == 1


def _disjoint(a: Use, b: Use) -> bool:
    """Whether two uses of one parameter axis cover disjoint slices, read off their
    parts along a common part axis (without shapes, negative and positive axes are not
    compared)."""
    ranges_b = _ranges(b)
    for axis, (lo, hi) in _ranges(a).items():
        if axis in ranges_b:
            lo_b, hi_b = ranges_b[axis]
            if hi <= lo_b or hi_b <= lo:
                return True
    return False


def fit_problems(spaces: Sequence[Space], params: Mapping[str, Tensor]) -> list[Problem]:
    """The spaces that do not fit ``params`` (a missing parameter, an axis of another
    size, an elementwise parameter in a group that cannot act on it), first use first."""
    problems: list[Problem] = []
    for i, space in enumerate(spaces):
        message = _fit_problem(space, params)
        if message is not None:
            problems.append((i, message))
    return problems


def _fit_problem(space: Space, params: Mapping[str, Tensor]) -> str | None:
    for use in space.uses:
        if use.param not in params:
            return f"space {space.name!r} uses missing parameter {use.param!r}"
        try:
            space.check_axis(use, params[use.param].shape)
        except ValueError as err:
            return str(err)
        if use.role == "elementwise" and not space.group.elementwise_ok:
            return (
                f"{type(space.group).__name__} space {space.name!r} cannot act on "
                f"elementwise parameter {use.param!r}"
            )
    return None
