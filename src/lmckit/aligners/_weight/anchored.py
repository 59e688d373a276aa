"""The anchored start of weight matching: solve spaces outward from the fixed axes.

Coordinate descent from the identity compares every use of a space under the *current*
elements of the other spaces, which at the start are arbitrary: a residual stream is
first matched through attention and MLP weights whose heads and units are still in
unrelated orders, and descent can settle in a poor optimum (two GPT-2s of the reference
comparison: 1.23 from the identity, 0.74-0.79 once the residual map comes from the
embeddings alone).

The anchored start orders the solves by what is already known. A use of a space (a
parameter axis) is *anchored* once every other axis of its parameter lies in no space
(tokens, positions, input pixels, classes: axes both models share) or in a space that is
already solved; its term of the objective then does not depend on any unsolved element.
Stage 0 solves every space that has an anchored use with another axis (a matrix, not
only a bias) from its anchored uses alone; each later stage does the same with the
spaces solved so far held fixed, until no space is left or none becomes ready (those
stay at the start). Spaces of one stage never share an anchored use, so each is solved
once, exactly. Weight matching then runs full coordinate descent from there.

For a GPT-2 this is the residual stream from the token and position embeddings and the
LM head (plus the residual writers' biases), then every layer's heads and MLP units
given the residual map; for an MLP the first and last hidden layers from the input and
output weights, then the layers next to them, inwards. Nothing is tuned: the schedule is
read from the spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from torch import Tensor

from lmckit.aligners._weight.sharding import Sharding, summed_over_ranks
from lmckit.aligners._weight.similarity import space_problem
from lmckit.groups._base import Subproblem
from lmckit.runtime._distributed import gather_from_ranks
from lmckit.symmetry._params import layout
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform, Use

__all__ = ["anchor_stages", "anchored_start"]


def _axis_spaces(spec: SymmetrySpec, param: str, ndim: int) -> dict[int, set[str]]:
    """Which spaces each axis of ``param`` lies in (axes in no space are left out)."""
    out: dict[int, set[str]] = {}
    for s, u in spec.uses_of(param):
        out.setdefault(u.axis % ndim, set()).add(s.name)
    return out


def _anchored_uses(
    spec: SymmetrySpec, space: Space, solved: Iterable[str], ndims: Mapping[str, int]
) -> tuple[list[Use], bool]:
    """The uses of ``space`` whose other axes are fixed or solved, and whether one of
    them pins the space (has another axis, and is a use the group's solver reads)."""
    known = set(solved)
    uses: list[Use] = []
    pinned = False
    if space.nest is not None and space.nest.parent not in known:
        return uses, pinned  # a nested space acts where its parent puts its unit
    # the bases inside each unit move the unit's own axes too: unless the units are
    # compared by circuits (invariant to those bases), a use they touch is not anchored
    # until they are solved (heads matched by value rows a value basis scrambled)
    inner = [] if space.circuits is not None else [
        u for s in spec.nested_in(space.name) if s.name not in known for u in s.uses
    ]  # fmt: skip
    for use in space.uses:
        if not use.compare or use.param not in ndims:
            continue
        ndim = ndims[use.param]
        axis = use.axis % ndim
        others = {a: s for a, s in _axis_spaces(spec, use.param, ndim).items() if a != axis}
        if any(name not in known for names in others.values() for name in names):
            continue
        if any(u.param == use.param and u.axis % ndim == axis for u in inner):
            continue
        uses.append(use)
        solver_reads = use.role == "write" or not space.group.least_squares
        pinned = pinned or (ndim > 1 and solver_reads)
    return uses, pinned


def anchor_stages(
    spec: SymmetrySpec,
    ndims: Mapping[str, int],
    *,
    names: Sequence[str] | None = None,
) -> list[list[tuple[str, tuple[Use, ...]]]]:
    """The anchored schedule: per stage, each space solved then and the uses it reads.

    Args:
        spec: the symmetry spec.
        ndims: number of axes of every parameter (``{name: tensor.ndim}``).
        names: the spaces to solve (default all); the others count as solved (they are
            held at their given elements).

    Returns:
        Stages in order; a space that never becomes ready is in none of them.
    """
    todo = list(spec.names if names is None else names)
    solved = [s for s in spec.names if s not in todo]
    stages: list[list[tuple[str, tuple[Use, ...]]]] = []
    while todo:
        stage = []
        for name in todo:
            uses, pinned = _anchored_uses(spec, spec[name], solved, ndims)
            if pinned:
                stage.append((name, tuple(uses)))
        if not stage:
            break
        stages.append(stage)
        done = {name for name, _ in stage}
        solved += sorted(done)
        todo = [n for n in todo if n not in done]
    return stages


def _restricted(spec: SymmetrySpec, name: str, uses: tuple[Use, ...]) -> SymmetrySpec:
    """``spec`` with space ``name`` comparing the two models on ``uses`` only."""
    keep = set(uses)
    spaces = tuple(
        dataclasses.replace(
            s, uses=tuple(dataclasses.replace(u, compare=u in keep) for u in s.uses)
        )
        if s.name == name
        else s
        for s in spec
    )
    return SymmetrySpec(spaces, spec.meta)


def anchored_start(
    spec: SymmetrySpec,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    start: Transform,
    *,
    names: Sequence[str] | None = None,
    sharding: Sharding | None = None,
) -> Transform:
    """The anchored initial transform (module docstring) for weight matching.

    Args:
        spec: the symmetry spec (of ``other``'s widths).
        ref, other: the two models' float parameters, as weight matching compares them
            (row masks and weights applied).
        start: the elements to begin from (identities or plain embeddings); spaces
            outside ``names`` and spaces that never become ready keep theirs.
        names: the spaces to solve (default all).
        sharding: across processes, which process reads which parameter and solves
            which space (:mod:`lmckit.aligners._weight.sharding`); default: this process
            reads and solves everything.

    Returns:
        A transform of ``spec`` with every ready space solved from its anchored uses.
    """
    ndims = {k: v.ndim for k, v in layout(other).items()}  # shapes only: nothing computed
    transform = start
    for stage in anchor_stages(spec, ndims, names=names):
        solved: dict[str, object] = {}
        for name, uses in stage:
            how = sharding.solver[name] if sharding is not None else 0
            mine = sharding is None or how in ("every", sharding.rank)
            if how == "split":  # each process adds the terms of its own parameters
                assert sharding is not None
                own = tuple(u for u in uses if sharding.owns(u.param))
                part = (
                    _anchored_problem(spec, name, own, ref, other, transform).sim if own else None
                )
                problem = Subproblem(summed_over_ranks(part))
                solved[name] = spec[name].group.solve_subproblem(problem)
            elif mine:
                problem = _anchored_problem(spec, name, uses, ref, other, transform)
                solved[name] = spec[name].group.solve_subproblem(problem)
        if sharding is not None and sharding.size > 1:  # spaces solved by one process
            alone = {k: v for k, v in solved.items() if sharding.solver[k] == sharding.rank}
            for elements in gather_from_ranks(alone):
                solved |= elements
        # spaces of one stage share no anchored use: set them together
        transform = transform.replace(**solved)
    return transform


def _anchored_problem(
    spec: SymmetrySpec,
    name: str,
    uses: tuple[Use, ...],
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
) -> Subproblem:
    """Space ``name``'s subproblem on ``uses`` alone."""
    narrowed = _restricted(spec, name, uses)
    # heads compared by circuits read their projections whatever ``compare`` says; they
    # are only ready once the residual they read is solved
    return space_problem(narrowed, narrowed[name], ref, other, transform, circuits=False)
