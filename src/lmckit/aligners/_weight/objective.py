"""The weight-matching objective, measured: per space and in total.

``sum_p <theta_a[p], T(theta_b)[p]>`` over the compared parameters, split by space for
the diagnostics of an alignment (:class:`lmckit.aligners.SpaceDiagnostics`). Inner
products are summed in float64 without float64 copies of the operands, and each
parameter is moved by the transform once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from lmckit.aligners._weight.circuits import circuit_params, head_similarity_matrix
from lmckit.aligners._weight.similarity import space_problem
from lmckit.symmetry._spaces import Part, region
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform, apply_to_param

__all__ = [
    "inner",
    "space_objective",
    "space_objectives",
    "sweep_limit_note",
    "total_objective",
]

#: Sweeps :func:`sweep_limit_note` looks back over.
LOOK_BACK = 10


def sweep_limit_note(history: Sequence[float], limit: int) -> str:
    """What a coordinate descent stopped by its sweep ``limit`` was doing: its objective
    still rising over the last sweeps (more sweeps would improve it) or oscillating
    (moving both ways: more sweeps may not settle it); after a single sweep, that there
    is nothing yet to tell. ``history``: the objective after each sweep."""
    if len(history) < 2:  # no sweep to compare the only one with
        return (
            f"sweep limit {limit} reached after one sweep, "
            "before a second could show whether the objective still rises"
        )
    tail = list(history[-(LOOK_BACK + 1) :])
    steps = [b - a for a, b in zip(tail, tail[1:], strict=False)]
    scale = max(abs(tail[-1]), 1e-12)
    if all(d >= 0 for d in steps):
        gain = (tail[-1] - tail[0]) / scale
        return (
            f"sweep limit {limit} reached, objective still rising "
            f"(+{100 * gain:.3g}% over the last {_sweeps(len(steps))})"
        )
    spread = (max(tail) - min(tail)) / scale
    return (
        f"sweep limit {limit} reached, objective oscillating "
        f"(range {100 * spread:.3g}% over the last {_sweeps(len(steps))})"
    )


def _sweeps(count: int) -> str:
    return "sweep" if count == 1 else f"{count} sweeps"


def space_objective(
    spec: SymmetrySpec,
    space: Space,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
) -> float:
    """The objective of one space under ``transform``.

    For most groups ``sum_u <A_u, T(B)_u>`` over the space's compared uses, an
    elementwise inner product that needs no ``n x n`` product; head spaces compared by
    circuits and least-squares spaces report ``<T_s, C_s>`` of their subproblem.
    """
    if space.circuits is not None or space.group.least_squares:
        sim = space_problem(spec, space, ref, other, transform).sim
        return space.group.objective(transform[space.name], sim)
    total = 0.0
    for use in (u for u in space.uses if u.compare):
        b = apply_to_param(spec, use.param, other[use.param], transform)
        total += inner(use.region(ref[use.param]), use.region(b))
    return total


def space_objectives(
    spec: SymmetrySpec,
    names: Sequence[str],
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
    *,
    owns: Callable[[str], bool] | None = None,
    whole: Callable[[str], bool] | None = None,
) -> dict[str, float]:
    """:func:`space_objective` of every space in ``names``, moving each parameter once.

    Across processes (:mod:`lmckit.aligners._weight.sharding`), each process gives its
    share, and the shares add up to the objectives: the terms of the parameters it
    ``owns``, and the spaces compared through their whole subproblem (head circuits,
    least squares) that ``whole`` names (others give 0). Default: everything.
    """
    # every compared region of every parameter, each parameter moved once
    wanted: dict[str, set[tuple[Part, ...]]] = {}
    for name in names:
        space = spec[name]
        if space.circuits is None and not space.group.least_squares:
            for use in (u for u in space.uses if u.compare):
                if owns is None or owns(use.param):
                    wanted.setdefault(use.param, set()).add(use.parts)
    # head spaces compared by circuits, by the parameters their circuits read: these are
    # moved once for all of a layer's head spaces (and their compared regions)
    heads: dict[tuple[str, ...], list[Space]] = {}
    for name in names:
        space = spec[name]
        if space.circuits is not None and not space.group.least_squares:
            if whole is None or whole(name):
                heads.setdefault(circuit_params(space.circuits), []).append(space)
    per_region: dict[tuple[str, tuple[Part, ...]], float] = {}
    out: dict[str, float] = {}
    for params, spaces in heads.items():
        moved = {p: apply_to_param(spec, p, other[p], transform) for p in params}
        for param in params:
            for parts in wanted.pop(param, ()):
                per_region[(param, parts)] = inner(
                    region(ref[param], parts), region(moved[param], parts)
                )
        for space in spaces:
            out[space.name] = _moved_heads_objective(spec, space, ref, moved)
        del moved
    for param, parts_set in wanted.items():
        b = apply_to_param(spec, param, other[param], transform)
        for parts in parts_set:
            per_region[(param, parts)] = inner(region(ref[param], parts), region(b, parts))
    for name in names:
        space = spec[name]
        if name in out:
            continue
        if space.circuits is not None or space.group.least_squares:
            mine = whole is None or whole(name)
            out[name] = space_objective(spec, space, ref, other, transform) if mine else 0.0
        else:
            terms = (per_region.get((u.param, u.parts), 0.0) for u in space.uses if u.compare)
            out[name] = sum(terms, 0.0)
    return {name: out[name] for name in names}


def _moved_heads_objective(
    spec: SymmetrySpec, space: Space, ref: Mapping[str, Tensor], moved: Mapping[str, Tensor]
) -> float:
    """The objective of head space ``space`` from B's circuit parameters ``moved`` by the
    whole transform, its own element included: the similarity's value at the identity
    (what :func:`space_objective` gives, without moving the parameters per space)."""
    within = any(s.circuits is not None for s in spec.nested_in(space.name))
    sim = head_similarity_matrix(space, ref, moved, within=within)
    return float(space.group.objective(space.group.identity(space.n), sim))


def inner(a: Tensor, b: Tensor) -> float:
    """``<a, b>`` summed in float64 (no float64 copies of the operands)."""
    return float((a * b).sum(dtype=torch.float64))


def total_objective(
    spec: SymmetrySpec,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
    *,
    owns: Callable[[str], bool] | None = None,
) -> float:
    """``sum_p <A_p, T(B)_p>`` over every compared parameter (each counted once; with
    ``owns``, over those it names: one process's share)."""
    total = 0.0
    for name in {u.param for s in spec for u in s.uses if u.compare}:
        if owns is not None and not owns(name):
            continue
        b = apply_to_param(spec, name, other[name], transform)
        total += inner(ref[name], b)
    return total
