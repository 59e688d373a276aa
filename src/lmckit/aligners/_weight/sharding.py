"""Which process reads which parameters in weight matching across processes.

With a process group (:mod:`lmckit.runtime._distributed`) every parameter has one *owner*, the
only process that reads it. Spaces are grouped with the spaces nested in them (a block
of heads with its query heads, value bases and rotary planes; an MLP with its up-branch
scales) into *components*; a parameter belongs to the smallest component that reads it
(``q_proj`` to its heads, not to the residual stream), and the components are dealt to
the processes largest first, each to the process holding the fewest bytes so far.

A space then is solved in one of three ways (:attr:`Sharding.solver`):

* by one process, when every parameter its subproblem reads has that owner (the heads
  and MLP units of a transformer): the others receive its element;
* ``"split"``, when its parameters have several owners (a residual stream reads every
  layer): each process adds the terms of the parameters it owns, the partial
  similarities are gathered and summed in rank order, and every process solves the same
  sum to the same element;
* ``"every"``, when its parameters have several owners and its subproblem is not a
  plain sum of terms (head circuits, least-squares and unit-norm groups): every process
  reads what it needs and solves it whole.

The finiteness check and the objectives weight matching reports are shared the same
way (:func:`check_finite_over_ranks`, :func:`objectives_over_ranks`,
:func:`total_over_ranks`: each process's share, added up). In one process every
parameter is its own and every space is solved by it, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lmckit.aligners._weight.circuits import circuit_params
from lmckit.aligners._weight.objective import space_objectives, total_objective
from lmckit.aligners._weight.similarity import circuit_partners
from lmckit.runtime._distributed import gather_from_ranks, sum_over_ranks, world
from lmckit.symmetry._params import first_nonfinite, layout
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform

__all__ = [
    "Sharding",
    "check_finite_over_ranks",
    "objectives_over_ranks",
    "param_bytes",
    "shard_params",
    "summed_over_ranks",
    "total_over_ranks",
]

Solver = int | Literal["split", "every"]


@dataclass(frozen=True)
class Sharding:
    """Owners of parameters and solvers of spaces for one process (module docstring).

    Attributes:
        rank, size: this process and the number of processes.
        owner: parameter name -> the process that reads it.
        solver: space name -> the process that solves it alone, ``"split"`` or ``"every"``.
    """

    rank: int
    size: int
    owner: Mapping[str, int]
    solver: Mapping[str, Solver]

    def owns(self, param: str) -> bool:
        """Whether this process reads ``param`` (every parameter, in one process)."""
        return self.size == 1 or self.owner.get(param, 0) == self.rank

    def owned(self) -> frozenset[str]:
        """The parameters this process reads."""
        return frozenset(p for p, r in self.owner.items() if r == self.rank)


def _root(spec: SymmetrySpec, space: Space) -> str:
    """The outermost space ``space`` lives in (itself when it is not enclosed)."""
    while space.nest is not None or space.within is not None:
        parent = space.nest.parent if space.nest is not None else space.within
        assert parent is not None
        space = spec[parent]
    return space.name


def reads(spec: SymmetrySpec, space: Space, circuits: bool) -> frozenset[str]:
    """The parameters the subproblem of ``space`` reads (compared uses, its own head
    circuits, and with ``circuits`` the circuits of the heads it feeds or is fed by)."""
    out = {u.param for u in space.uses if u.compare} | set(circuit_params(space.circuits))
    if circuits and space.circuits is None and not space.group.least_squares:
        partners, replaced = circuit_partners(spec, space)
        out -= replaced
        for heads, _, _ in partners:
            out |= set(circuit_params(heads.circuits))
    return frozenset(out)


def shard_params(
    spec: SymmetrySpec,
    sizes: Mapping[str, int],
    *,
    circuits: bool = True,
    rank: int | None = None,
    size: int | None = None,
) -> Sharding:
    """The owners and solvers for this process (module docstring).

    Args:
        spec: the symmetry spec.
        sizes: bytes of each parameter (what is balanced between processes).
        circuits: residual spaces see attention heads through their circuits (as
            weight matching's ``residual_circuits``).
        rank, size: default: this process in the current process group.
    """
    if rank is None or size is None:
        rank, size = world()
    read = {s.name: reads(spec, s, circuits) for s in spec}
    members: dict[str, set[str]] = {}  # component root -> parameters it reads
    for space in spec:
        members.setdefault(_root(spec, space), set()).update(read[space.name])
    roots = list(members)
    home: dict[str, str] = {}
    for param in sizes:
        holders = [r for r in roots if param in members[r]]
        if holders:  # the smallest component reading it (spec order on ties)
            home[param] = min(holders, key=lambda r: (len(members[r]), roots.index(r)))
    weight = dict.fromkeys(roots, 0)
    for param, root in home.items():
        weight[root] += sizes[param]
    load = [0] * size
    assigned: dict[str, int] = {}
    for root in sorted(roots, key=lambda r: (-weight[r], roots.index(r))):
        target = min(range(size), key=lambda r: (load[r], r))
        assigned[root] = target
        load[target] += weight[root]
    owner = {param: assigned[root] for param, root in home.items()}
    solver: dict[str, Solver] = {}
    for space in spec:
        owners = {owner[p] for p in read[space.name] if p in owner}
        if space.circuits is not None or space.group.least_squares or space.group.needs_norms:
            solver[space.name] = "every" if len(owners) > 1 else _only(owners)
        else:
            solver[space.name] = "split" if len(owners) > 1 else _only(owners)
    return Sharding(rank, size, owner, solver)


def param_bytes(params: Mapping[str, Tensor]) -> dict[str, int]:
    """Bytes of each parameter, read from shapes (nothing computed)."""
    return {k: v.numel() * v.element_size() for k, v in layout(params).items()}


def _only(owners: set[int]) -> int:
    return next(iter(owners)) if owners else 0


def summed_over_ranks(part: Tensor | None) -> Tensor:
    """The sum of every process's ``part`` (``None``: nothing to add), in rank order, so
    that every process gets the same tensor bit for bit.

    Raises ``ValueError`` if no process had a part.
    """
    parts = [p for p in gather_from_ranks(part) if p is not None]
    if not parts:
        raise ValueError("no process has a term of this space")
    total = parts[0].clone()
    for p in parts[1:]:
        total.add_(p.to(total.device))
    return total


def check_finite_over_ranks(
    params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], sharding: Sharding
) -> None:
    """Raise ``ValueError`` naming the first parameter with a NaN or infinity (across
    processes each reads its own parameters, and all raise the same error)."""
    for params, what in ((params_a, "first model"), (params_b, "second model")):
        bad = first_nonfinite(params, sharding.owns)
        if sharding.size > 1:
            found = set(gather_from_ranks(bad))
            bad = next((k for k in params if k in found), None)
        if bad is not None:
            raise ValueError(f"{what}: {bad!r} contains NaN or infinite values")


def objectives_over_ranks(
    spec: SymmetrySpec,
    names: Sequence[str],
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
    sharding: Sharding,
) -> dict[str, float]:
    """Every space's objective: across processes, each process's share added up."""
    if sharding.size == 1:
        return space_objectives(spec, names, ref, other, transform)

    def whole(name: str) -> bool:  # counted once: by its solver, or by process 0
        how = sharding.solver[name]
        return sharding.rank == 0 if how == "every" else how == sharding.rank

    share = space_objectives(spec, names, ref, other, transform, owns=sharding.owns, whole=whole)
    (summed,) = sum_over_ranks([torch.tensor([share[n] for n in names], dtype=torch.float64)])
    return dict(zip(names, summed.tolist(), strict=True))


def total_over_ranks(
    spec: SymmetrySpec,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
    sharding: Sharding,
) -> float:
    """The total objective: across processes, each process's share added up."""
    if sharding.size == 1:
        return total_objective(spec, ref, other, transform)
    share = total_objective(spec, ref, other, transform, owns=sharding.owns)
    return float(sum_over_ranks([torch.tensor([share], dtype=torch.float64)])[0])
