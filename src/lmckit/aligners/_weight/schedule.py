"""The order in which a sweep of weight matching solves its spaces, in steps of spaces
that can be solved at the same time.

Two spaces are *independent* when neither reads the other's element (nor the elements
of spaces nested in the other): solving one leaves the other's subproblem as it was,
so solving them one after the other, in either order, or at the same time on two
processes gives the same elements. A sweep is cut into *steps* of pairwise independent
spaces:

* ``"sequential"`` (the default): the sweep's random order, cut wherever the next
  space depends on one already in the step. One process solves exactly what it solved
  before steps existed; several processes solve each step's spaces side by side.
* ``"coloured"``: the spaces are coloured greedily in the sweep's random order (each
  takes the first colour none of its dependencies has) and each colour is one step:
  fewer, larger steps (in a transformer, every head and MLP space of every layer
  shares one colour, the residual stream another), so more work in parallel, in an
  order that differs from ``"sequential"``'s. One process and several give the same
  result for the same schedule.

With a process group (:mod:`lmckit.runtime._distributed`), each process solves the spaces of a
step whose parameters it owns, the processes share the terms of the others
(:mod:`lmckit.aligners._weight.sharding`), and the elements are exchanged before the
next step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

__all__ = ["SCHEDULES", "Schedule", "independent", "sweep_steps"]

Schedule = Literal["sequential", "coloured"]
#: Values of :attr:`lmckit.aligners.WeightMatchingConfig.schedule`.
SCHEDULES: tuple[Schedule, ...] = ("sequential", "coloured")


def independent(
    first: str,
    second: str,
    deps: Mapping[str, frozenset[str] | set[str] | Sequence[str]],
    nested: Mapping[str, Sequence[str]],
) -> bool:
    """Whether neither space's subproblem reads what solving the other changes (its
    element and the elements of the spaces nested in it)."""
    if first == second:
        return False
    moves_first = {first, *nested.get(first, ())}
    moves_second = {second, *nested.get(second, ())}
    return not (moves_second & set(deps[first])) and not (moves_first & set(deps[second]))


def sweep_steps(
    order: Sequence[str],
    deps: Mapping[str, frozenset[str] | set[str] | Sequence[str]],
    nested: Mapping[str, Sequence[str]],
    schedule: Schedule = "sequential",
) -> list[list[str]]:
    """``order`` (a sweep's random order of spaces) cut into steps of pairwise
    independent spaces, as ``schedule`` says (module docstring)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    steps: list[list[str]] = []
    if schedule == "sequential":
        for name in order:
            if steps and all(independent(name, other, deps, nested) for other in steps[-1]):
                steps[-1].append(name)
            else:
                steps.append([name])
        return steps
    for name in order:
        for step in steps:
            if all(independent(name, other, deps, nested) for other in step):
                step.append(name)
                break
        else:
            steps.append([name])
    return steps
