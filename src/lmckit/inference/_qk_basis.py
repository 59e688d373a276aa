"""The query/key basis of heads with rotary positions: proposed, then decided by a check.

Inside a head, a map on the keys and its inverse transpose on the queries keep every
score, unless something between the projections and the score pins the basis. Rotary
position embeddings do (they multiply by constants that vary along the head dimension),
yet a rotation of each rotary plane commutes with them
(:class:`~lmckit.groups.RotaryPlanes`). Which dimensions pair up, and how many are rotary,
is written in the module's arithmetic (slices, strides, concatenations), not in its
graph's shapes; so the candidates are proposed in order -- the rotate-half and the
interleaved layout over the whole head, then over each prefix a slice of the graph cut
off (partial rotary embeddings) -- and the first whose random elements leave the
function unchanged is kept, or the largest group containing it that passes too (with
neighbouring dims paired, the planes of a prefix and any orthogonal map of the rest).

A norm of the queries and keys before the rotary embedding (``g * x / rms(x)``, over each
head's features or the whole projection: "qk-norm") keeps only the maps that commute
with its weight: of the planes' rotations, a half turn of each
(:class:`~lmckit.groups.PlaneSigns`), proposed after the rotations (which a weight that
is one value throughout keeps whole). A group that cannot act on a use (rotations on a
norm's weight) is not tried. A head basis that no candidate keeps (a norm that also
subtracts the mean, an unknown positional scheme) is left out, and said so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from torch import Tensor

from lmckit.groups import Group, PlaneSigns, RotaryPlanes
from lmckit.inference._check import FunctionCheck
from lmckit.inference._conflicts import admissible, first_problem
from lmckit.inference._emit import Candidate
from lmckit.symmetry._transform import Nest, Space

__all__ = ["candidate_groups", "decide_candidates", "first_choices"]

#: a candidate is kept when its random elements move the outputs by at most this much
#: (relative, float64; scaled like check_spec's tolerance when the module runs in float32)
RTOL = 1e-5


def candidate_groups(size: int, cuts: Iterable[int]) -> list[Group]:
    """The groups to try for a query/key basis of ``size`` dims: the rotate-half and the
    interleaved layout over the whole head, then over each prefix a slice cut off (the
    likeliest first; :func:`_widest` then looks for a larger group that also passes)."""
    rotary = [size, *sorted({c for c in cuts if 0 < c < size and c % 2 == 0}, reverse=True)]
    if size % 2:
        rotary = rotary[1:]
    layouts = [(r, interleaved) for r in rotary for interleaved in (False, True)]
    # then what survives a norm with a weight before the rotary embedding: a half turn
    # of each plane (PlaneSigns)
    return [RotaryPlanes(*layout) for layout in layouts] + [PlaneSigns(*lo) for lo in layouts]


def _groups(candidate: Candidate) -> list[Group]:
    """:func:`candidate_groups` of ``candidate``; for a basis that a norm's weight shared
    by every head scales (no use of the spaces), only the groups that keep such scales
    as they are: a rotation that passes on a weight of ones moves a trained one."""
    groups = candidate_groups(candidate.size, candidate.cuts)
    return [g for g in groups if g.keeps_scales] if candidate.scaled else groups


def _contains(big: Group, small: Group) -> bool:
    """Whether every element of ``small`` is one of ``big`` (on the same dims): with
    neighbouring dims paired, rotating the planes of fewer leading dims and any
    orthogonal map of the rest includes rotating the planes of more of them (likewise
    their signs)."""
    if type(big) is not type(small) or not isinstance(big, RotaryPlanes | PlaneSigns):
        return False
    assert isinstance(small, RotaryPlanes | PlaneSigns)
    return big.interleaved and small.interleaved and big.rotary < small.rotary


def _spaces(candidate: Candidate, group: Group) -> list[Space]:
    units = candidate.units
    if group.keeps_scales:  # a norm's weight stays as it is: no use of the space
        units = tuple(tuple(u for u in uses if u.role != "elementwise") for uses in units)
    if candidate.shared:
        (uses,) = units
        name = f"{candidate.parent}.{candidate.kind}"
        if not candidate.nested:  # alike in every head of heads whose order is fixed
            alike = Nest(candidate.parent, None, candidate.kind)
            return [Space(name, candidate.size, group, uses, inside=alike)]
        return [Space(name, candidate.size, group, uses, within=candidate.parent)]
    out = []
    for unit, uses in enumerate(units):
        name = f"{candidate.parent}.{candidate.kind}.{unit}"
        nest = Nest(candidate.parent, unit, candidate.kind)
        if candidate.nested:
            out.append(Space(name, candidate.size, group, uses, nest=nest))
        else:  # heads whose order is fixed: a space per head, nested in none
            out.append(Space(name, candidate.size, group, uses, inside=nest))
    return out


def _with(spaces: Sequence[Space], added: Sequence[Space]) -> list[Space]:
    """``spaces`` with ``added`` placed after their parents' other nested spaces."""
    order = list(spaces)
    for space in added:
        where = space.nest or space.inside
        parent = where.parent if where is not None else space.within
        family = [i for i, s in enumerate(order) if s.name == parent or (
            s.nest is not None and s.nest.parent == parent) or (
            s.name.startswith(f"{parent}."))]  # fmt: skip
        order.insert(family[-1] + 1 if family else len(order), space)
    return order


def first_choices(
    spaces: list[Space], candidates: Sequence[Candidate], layout: Mapping[str, Tensor]
) -> tuple[list[Space], list[str]]:
    """``spaces`` with every candidate in its first group that can be added to them
    (one that acts on every use, clashing with no space), unchecked: what
    :func:`decide_candidates` keeps when everything passes; and a note per candidate
    that no group can be added for."""
    notes = []
    for candidate in candidates:
        problem = None
        for group in _groups(candidate):
            added = _spaces(candidate, group)
            trial = _with(spaces, added)
            found = first_problem(trial, layout, added=added)
            if found is None:
                spaces = trial
                break
            problem = problem or found
        else:
            notes.append(_cannot_add(candidate, problem))
    return spaces, notes


def _cannot_add(candidate: Candidate, problem: str | None) -> str:
    return f"{candidate.parent}: the query/key basis inside its heads is left out ({problem})"


def decide_candidates(
    spaces: list[Space], candidates: Sequence[Candidate], check: FunctionCheck, *, seed: int = 0
) -> tuple[list[Space], list[str]]:
    """``spaces`` with every candidate whose first passing group was found added (the
    largest of the groups tried that passes, see :func:`_widest`).

    Candidates with the same choice of groups are decided together (one model, one
    layout), each layer alone only if that fails. Returns the spaces and one note per
    candidate left out.
    """
    notes: list[str] = []
    tolerance = RTOL * check.scale
    by_shape: dict[tuple[int, tuple[int, ...], bool], list[Candidate]] = {}
    for candidate in candidates:
        shape = (candidate.size, candidate.cuts, candidate.scaled)
        by_shape.setdefault(shape, []).append(candidate)
    for group_of in by_shape.values():
        groups = _groups(group_of[0])
        chosen = _first_passing(spaces, group_of, groups, check, tolerance, seed)
        if chosen is not None:
            spaces = _with(spaces, [s for c in group_of for s in _spaces(c, chosen)])
            continue
        for candidate in group_of:  # layers may differ: each alone
            one = _first_passing(spaces, [candidate], groups, check, tolerance, seed)
            if one is not None:
                spaces = _with(spaces, _spaces(candidate, one))
                continue
            problems = [first_problem(_with(spaces, _spaces(candidate, g)), check.layout)
                        for g in groups]  # fmt: skip
            if all(problems):  # no group can even be added
                notes.append(_cannot_add(candidate, problems[0]))
            else:
                notes.append(
                    f"{candidate.parent}: the query/key basis inside its heads is fixed "
                    "(no rotation or sign of rotary planes keeps the function)"
                )
    return spaces, notes


def _passes(
    spaces: Sequence[Space],
    candidates: Sequence[Candidate],
    group: Group,
    check: FunctionCheck,
    tolerance: float,
    seed: int,
) -> bool:
    """Whether ``candidates`` in ``group`` can be added to ``spaces`` and a random
    element of theirs keeps the function."""
    added = [s for c in candidates for s in _spaces(c, group)]
    spec = admissible(_with(spaces, added), check.layout)
    if spec is None:  # a group that cannot act on every use, or a clash
        return False
    error = check.random_error(spec, [s.name for s in added], seed, keep_within=tolerance)
    return error <= tolerance


def _first_passing(
    spaces: Sequence[Space],
    candidates: Sequence[Candidate],
    groups: Sequence[Group],
    check: FunctionCheck,
    tolerance: float,
    seed: int,
) -> Group | None:
    for group in groups:
        if _passes(spaces, candidates, group, check, tolerance, seed):
            return _widest(spaces, candidates, group, groups, check, tolerance, seed)
    return None


def _widest(
    spaces: Sequence[Space],
    candidates: Sequence[Candidate],
    found: Group,
    groups: Sequence[Group],
    check: FunctionCheck,
    tolerance: float,
    seed: int,
) -> Group:
    """The largest of ``groups`` containing ``found`` that passes too (``found`` itself
    if none): interleaved planes over the whole head pass where only a prefix rotates
    (the pass-through dims paired into planes are a part of their orthogonal block),
    and the prefix's group is the whole symmetry."""
    wider = sorted((g for g in groups if _contains(g, found)), key=_size)
    for group in wider:
        if _passes(spaces, candidates, group, check, tolerance, seed):
            return group
    return found


def _size(group: Group) -> int:
    """Fewer rotary dims, a larger group (sort key: largest first)."""
    return group.rotary if isinstance(group, RotaryPlanes | PlaneSigns) else 0
