"""Weight matching's coordinate descent: one space at a time, in steps of spaces that
share nothing (:mod:`lmckit.aligners._weight.schedule`), across processes when there is a
process group (:mod:`lmckit.runtime._distributed`).

Holding the others fixed, a space's objective is linear in its element and its group
solves it; exact solvers' answers are taken only when the objective rises (so it never
falls), the others' whenever they change. A space none of whose inputs moved since its
last solve is skipped: its solver would return the same element.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm.auto import tqdm

from lmckit.aligners._weight.incremental import SimilarityCache
from lmckit.aligners._weight.schedule import sweep_steps
from lmckit.aligners._weight.sharding import (
    Sharding,
    param_bytes,
    shard_params,
    summed_over_ranks,
)
from lmckit.groups._base import Subproblem
from lmckit.runtime._distributed import gather_from_ranks
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform

if TYPE_CHECKING:  # the config lives with the algorithm, which imports this module
    from lmckit.aligners._weight.matching import WeightMatchingConfig

__all__ = ["coordinate_descent"]


def coordinate_descent(
    spec: SymmetrySpec,
    names: Sequence[str],
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    init: Transform,
    config: WeightMatchingConfig,
    generator: torch.Generator,
    bar: tqdm,
    *,
    cache: SimilarityCache | None = None,
    sharding: Sharding | None = None,
) -> tuple[Transform, int, bool, list[float]]:
    """Sweep over ``names`` in random order until no space improves, or a sweep
    changes the objective by at most ``config.sweep_tol`` of it.

    Each update costs the products of what moved since the space was last solved
    (:class:`~lmckit.aligners._weight.incremental.SimilarityCache`, built here unless given) and
    one solve; a space none of whose inputs moved since its last solve is skipped, as
    its solver would return the same element. Across processes, ``sharding`` (built here
    unless given, with the cache) says which process solves which space and reads which
    parameter (:mod:`lmckit.aligners._weight.sharding`).

    Returns the transform, the number of sweeps, whether it converged, and the sum of
    the solved spaces' objectives after each sweep.
    """
    if sharding is None:
        sharding = shard_params(spec, param_bytes(other), circuits=config.residual_circuits)
    if cache is None:
        cache = SimilarityCache(
            spec, ref, other, circuits=config.residual_circuits, owns=sharding.owns
        )
    deps = {name: sorted(cache.depends_on(name)) for name in names}
    nested = {name: [s.name for s in spec.nested_in(name)] for name in names}
    # each space is always solved by the same process (or split the same way), so that
    # its cached similarity sees the same updates as in one process
    solver = sharding.solver
    version = dict.fromkeys(spec.names, 0)  # bumped when a space's element changes
    solved_at: dict[str, tuple[int, ...]] = {}  # versions of its inputs at its last solve
    transform = init
    current: dict[str, float] = {}
    history: list[float] = []
    for sweep in range(1, config.max_iter + 1):
        improved = False
        order = [names[i] for i in torch.randperm(len(names), generator=generator).tolist()]
        # a sweep of a large model takes minutes: the bar counts its spaces
        bar.reset(total=len(names))
        bar.set_description_str(f"weight matching, sweep {sweep}", refresh=False)
        for step in sweep_steps(order, deps, nested, config.schedule):
            inputs = {name: tuple(version[d] for d in deps[name]) for name in step}
            # a space none of whose inputs changed since its last solve would come out
            # the same: skipped
            todo = [name for name in step if solved_at.get(name) != inputs[name]]
            alone = [n for n in todo if solver[n] not in ("split", "every")]
            mine = [_solve(spec[n], transform, cache, bool(nested[n]), config)
                    for n in alone if solver[n] == sharding.rank]  # fmt: skip
            together = {
                n: _solve(spec[n], transform, cache, bool(nested[n]), config, solver[n] == "split")
                for n in todo if n not in alone
            }  # fmt: skip
            if sharding.size > 1:
                mine = _exchange(mine, alone)
            by_name = {sol.name: sol for sol in mine} | together
            solutions = [by_name[n] for n in todo]
            for sol in solutions:
                if sol.gain:
                    transform = _with_element(spec, transform, sol.name, sol.element)
                    version[sol.name] += 1
                    for inner in nested[sol.name]:
                        version[inner] += 1
                solved_at[sol.name] = inputs[sol.name]
                improved = improved or sol.gain
                current[sol.name] = sol.new if sol.gain else sol.old
            bar.update(len(step))
        history.append(sum(current.values()))
        bar.set_postfix(objective=f"{history[-1]:.5g}")
        if not improved or _stalled(history, config.sweep_tol):
            return transform, sweep, True, history
    return transform, config.max_iter, False, history


def _stalled(history: Sequence[float], sweep_tol: float) -> bool:
    """The last sweep changed the total objective by at most ``sweep_tol`` of it."""
    if len(history) < 2:
        return False
    return abs(history[-1] - history[-2]) <= sweep_tol * abs(history[-1])


@dataclass(frozen=True)
class _Solution:
    """One space solved: its new element, the objective at the new and the old one,
    and whether it is taken."""

    name: str
    element: Tensor
    new: float
    old: float
    gain: bool


def _home(spec: SymmetrySpec, transform: Transform, name: str) -> Transform:
    """``transform`` with space ``name`` undone: its nested spaces in its input frame,
    where they stay with the units they act on whatever its element becomes."""
    undo = spec[name].group.inverse(transform[name])
    return Transform(spec, {name: undo}).compose(transform)


def _solve(
    space: Space,
    transform: Transform,
    cache: SimilarityCache,
    has_nested: bool,
    config: WeightMatchingConfig,
    split: bool = False,
) -> _Solution:
    """Solve one space holding the others at ``transform`` (``split``: every process
    adds the terms of its own parameters, and all solve the sum)."""
    group = space.group
    # a space with nested spaces is solved with them in its input frame
    home = _home(cache.spec, transform, space.name) if has_nested else transform
    if split:
        problem = Subproblem(summed_over_ranks(cache.partial(space, home)))
    else:
        problem = cache.problem(space, home)
    element = group.solve_subproblem(problem)
    new = group.objective(element, problem.sim)
    old = group.objective(transform[space.name], problem.sim)
    if group.exact:
        gain = new > old + config.tol * max(abs(old), 1.0)
    else:  # least squares / heuristic split: take any new answer
        gain = not group.close(element, transform[space.name])
    return _Solution(space.name, element, float(new), float(old), bool(gain))


def _with_element(
    spec: SymmetrySpec, transform: Transform, name: str, element: Tensor
) -> Transform:
    """``transform`` with space ``name`` set to ``element`` (its nested spaces kept in
    its input frame)."""
    if spec.nested_in(name):
        return Transform(spec, {name: element}).compose(_home(spec, transform, name))
    return transform.replace(**{name: element})


def _exchange(mine: Sequence[_Solution], todo: Sequence[str]) -> list[_Solution]:
    """Every process's solutions of ``todo``, in its order, on every process."""
    if not todo:
        return []
    gathered = gather_from_ranks(list(mine))
    by_name = {sol.name: sol for part in gathered for sol in part}
    return [by_name[name] for name in todo]
