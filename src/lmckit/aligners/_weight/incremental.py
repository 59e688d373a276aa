"""Similarities kept across coordinate-descent updates, updated by what moved.

Weight matching solves one space at a time on ``C_s = sum_u A_u B~_u^T``
(:mod:`lmckit.aligners._weight.similarity`), where ``B~_u`` is the other model's parameter with the
other spaces' elements applied. From scratch that is one ``m x n x K_u`` product per use
at every update, although between two updates of a space only a few of its neighbours'
units have usually moved. When every other space on a use's parameter moves units by
gathering (permutations, head permutations: :attr:`lmckit.groups.Group.gathers`),
``B~_u`` is ``B_u`` indexed along each of its other axes, and if one axis's index map
changed at positions ``J`` only, the term changes by a product of rank ``|J|``::

    A_u B~_u,new^T = A_u B~_u,old^T + A_u[J] (B~_u,new[J] - B~_u,old[J])^T

(slices along that axis; both sides laid out with the space's units first).
:class:`SimilarityCache` keeps, per space solved more than once, the sum of such terms
and the index maps it was computed at. A space's other terms (next to orthogonal or
invertible maps, attention circuits) are computed afresh at each update. After the first
sweeps coordinate descent moves a few percent of a permutation per update, so most
updates cost a small part of the full products. When more than half of the tracked
columns moved, the sum is recomputed, which also discards the round-off that the updates
accumulate.

:meth:`SimilarityCache.depends_on` names the spaces whose elements a subproblem reads,
so that coordinate descent can skip a space none of whose inputs changed since it was
last solved: the (deterministic) solver would return the same element.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from lmckit.aligners._weight.circuits import circuit_params
from lmckit.aligners._weight.similarity import (
    add_use_term,
    circuit_partners,
    circuit_terms,
    moved_region,
    space_problem,
    use_width,
)
from lmckit.groups._base import Subproblem
from lmckit.symmetry._params import device_of, layout
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform, Use

__all__ = ["MIN_COLUMNS", "REFRESH", "SimilarityCache"]

#: a space's cached sum is recomputed once this fraction of its tracked columns moved
REFRESH = 0.5
#: a space whose trackable uses contract fewer columns in all keeps no cache (the cache
#: costs one ``m x n`` matrix; such terms are cheaper to recompute)
MIN_COLUMNS = 16


@dataclass
class _Tracked:
    """A use (of space ``space``) whose other axes move by gathers: its term follows
    their index maps."""

    space: str
    use: Use
    #: per gathered axis, the source position of each slice when the sum was computed
    sources: dict[int, Tensor] = field(default_factory=dict)


@dataclass
class _Plan:
    """How one space's similarity is built."""

    tracked: list[_Tracked]
    fresh: list[Use]
    circuits: bool
    cached: Tensor | None = None
    #: the space was solved once: its next sum is kept
    seen: bool = False


class SimilarityCache:
    """The subproblems of a spec's spaces for one pair of models, kept between updates.

    Args:
        spec: the symmetry spec.
        ref, other: the two models' float parameters (``other`` untransformed); read,
            never written.
        circuits: residual spaces see attention heads through their circuits
            (:func:`lmckit.aligners._weight.similarity.space_problem`).
        budget: bytes the cached sums may take in all (default: the size of
            ``other``); a space that does not fit is recomputed at every update.
        owns: the parameters whose terms this cache computes (default: all); the
            others are another process's (:mod:`lmckit.aligners._weight.sharding`).
    """

    def __init__(
        self,
        spec: SymmetrySpec,
        ref: Mapping[str, Tensor],
        other: Mapping[str, Tensor],
        *,
        circuits: bool = True,
        budget: int | None = None,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        self.spec, self.ref, self.other, self.circuits = spec, ref, other, circuits
        self.owns = owns or _everything
        # shapes read without computing a tensor (a lazy bfloat16 model is cast when a
        # value is read: once per use of it, not again for its shape)
        self._meta, self._ref_meta = layout(other), layout(ref)
        self._device = device_of(other)
        self._uses: dict[str, list[tuple[Space, Use]]] = {}
        for space in spec:
            for use in space.uses:
                self._uses.setdefault(use.param, []).append((space, use))
        if budget is None:
            budget = sum(v.numel() * v.element_size() for v in self._meta.values())
        self._budget = budget
        self._plans: dict[str, _Plan | None] = {}

    # ------------------------------------------------------------------ structure

    def depends_on(self, name: str) -> frozenset[str]:
        """Spaces whose elements the subproblem of space ``name`` reads (itself among
        them when its terms are linearised at its own element)."""
        space = self.spec[name]
        deps = {
            s.name
            for u in space.uses
            for s, v in self._uses[u.param]
            if (s.name, v) != (space.name, u)
        }
        # circuits read every projection of their heads, also those the space itself
        # does not use (a nested query space reads its group's keys and values)
        read = set(circuit_params(space.circuits))
        if self.circuits and space.circuits is None and not space.group.least_squares:
            partners, _ = circuit_partners(self.spec, space)
            if partners:
                deps.add(name)
                for heads, _, _ in partners:
                    read |= set(circuit_params(heads.circuits))
        deps |= {s.name for p in read for s, _ in self._uses.get(p, [])}
        return frozenset(deps)

    def _columns(self, use: Use, n: int) -> int:
        """``K``: columns of the use's ``(n, K)`` unit-major matrix."""
        size = math.prod(use.region_shape(self._meta[use.param].shape))
        return size // (use.outer * n * use.inner)

    def _trackable(self, space: Space, use: Use) -> bool:
        """Whether the use's term follows index maps of its parameter's other axes:
        every other space on the parameter gathers, and no use of it lives in a slice
        (a slice moves part of an axis, which no single index map describes)."""
        uses = self._uses[use.param]
        return all(not v.parts for _, v in uses) and all(
            s.group.gathers for s, v in uses if (s.name, v) != (space.name, use)
        )

    def _plan(self, space: Space) -> _Plan | None:
        if space.name in self._plans:
            return self._plans[space.name]
        plan = None
        group = space.group
        if space.circuits is None and not (group.least_squares or group.needs_norms):
            partners, replaced = (
                circuit_partners(self.spec, space) if self.circuits else ([], frozenset())
            )
            tracked: list[Use] = []
            fresh: list[Use] = []
            for use in space.uses:
                if not use.compare or use.param in replaced or not self.owns(use.param):
                    continue
                (tracked if self._trackable(space, use) else fresh).append(use)
            first = self._ref_meta[space.uses[0].param]
            m = use_width(first, space.uses[0])
            size = m * space.n * first.element_size()
            columns = sum(self._columns(u, space.n) for u in tracked)
            if columns < MIN_COLUMNS or size > self._budget:
                fresh, tracked = fresh + tracked, []
            else:
                self._budget -= size
            plan = _Plan([_Tracked(space.name, u) for u in tracked], fresh, bool(partners))
        self._plans[space.name] = plan
        return plan

    # ------------------------------------------------------------------- problems

    def problem(self, space: Space, transform: Transform) -> Subproblem:
        """The subproblem of ``space`` under ``transform``'s other elements.

        Same value as :func:`lmckit.aligners._weight.similarity.space_problem` (to float32
        round-off). The returned ``sim`` may be the cache's own matrix: read it before
        the next call for this space, and do not modify it.
        """
        plan = self._plan(space)
        if plan is None:  # least squares, unit norms, head circuits: from scratch
            return space_problem(
                self.spec, space, self.ref, self.other, transform, circuits=self.circuits
            )
        sim = self.partial(space, transform)
        if sim is None:
            raise ValueError(f"space {space.name!r} has no use to compare the two models on")
        return Subproblem(sim)

    def partial(self, space: Space, transform: Transform) -> Tensor | None:
        """The similarity terms of ``space`` over the parameters this cache owns
        (``None`` if it owns none), for a space whose terms several processes share.
        The same caveat as :meth:`problem`: the result may be the cache's own matrix."""
        plan = self._plan(space)
        if plan is None:
            raise ValueError(f"space {space.name!r} is not a sum of terms to share")
        sim: Tensor | None = None
        if plan.circuits:
            sim, _ = circuit_terms(self.spec, space, self.ref, self.other, transform,
                                   owns=self.owns)  # fmt: skip
        # uses of one parameter (slices of a fused projection) next to each other: each
        # parameter is read once, and only one is held at a time
        for param, uses in _by_param(plan.fresh).items():
            value, ref = self.other[param], self.ref[param]
            for use in uses:
                b = moved_region(self.spec, param, use.parts, value, transform,
                                 skip_use=(space.name, use))  # fmt: skip
                sim = add_use_term(sim, use.region(ref), b, replace(use, parts=()), space.n)
            del value, ref
        if plan.tracked:
            cached = self._tracked_sum(space, plan, transform)
            sim = cached if sim is None else sim.add_(cached)
        return sim

    def _sources(self, owner: str, use: Use, transform: Transform) -> dict[int, Tensor]:
        """Per other axis of the use's parameter that a space acts on: the source
        position of each slice of ``B~_u``."""
        value = self._meta[use.param]
        out = {}
        for space, other_use in self._uses[use.param]:
            if (space.name, other_use) == (owner, use):
                continue
            axis = other_use.axis % value.ndim
            index = torch.arange(value.shape[axis], device=self._device)
            if space.name in transform.elements:
                blocked = index.reshape(other_use.outer, space.n, other_use.inner)
                moved = space.group.act(blocked, transform.elements[space.name], other_use.role)
                index = moved.reshape(-1)
            out[axis] = index
        return out

    def _tracked_sum(self, space: Space, plan: _Plan, transform: Transform) -> Tensor:
        """The cached sum of the tracked terms, brought up to ``transform``."""
        maps = [self._sources(t.space, t.use, transform) for t in plan.tracked]
        if not plan.seen:
            # kept from the second solve on: a run that converges in one sweep (large
            # models far apart) never holds a sum it would not read again
            plan.seen = True
            once: Tensor | None = None
            for t, new in zip(plan.tracked, maps, strict=True):
                once = add_use_term(
                    once, self.ref[t.use.param], _gather(self.other[t.use.param], new), t.use,
                    space.n,
                )  # fmt: skip
            assert once is not None
            return once
        if plan.cached is not None:
            moved = total = 0
            changes: list[tuple[_Tracked, int, Tensor, dict[int, Tensor]]] = []
            many = False
            for t, new in zip(plan.tracked, maps, strict=True):
                columns = self._columns(t.use, space.n)
                total += columns
                diffs = [(ax, (new[ax] != t.sources[ax]).nonzero().squeeze(1)) for ax in new]
                diffs = [(ax, j) for ax, j in diffs if j.numel()]
                many = many or len(diffs) > 1
                for ax, j in diffs:
                    moved += columns * j.numel() // new[ax].numel()
                    changes.append((t, ax, j, new))
            if not many and moved < REFRESH * total:
                for t, ax, j, new in changes:
                    self._update(plan.cached, t, ax, j, new, space.n)
                return plan.cached
            plan.cached.zero_()
        cached = plan.cached
        for t, new in zip(plan.tracked, maps, strict=True):
            b = _gather(self.other[t.use.param], new)
            cached = add_use_term(cached, self.ref[t.use.param], b, t.use, space.n)
            t.sources = new
        plan.cached = cached
        assert cached is not None
        return cached

    def _update(
        self, cached: Tensor, t: _Tracked, axis: int, j: Tensor, new: dict[int, Tensor], n: int
    ) -> None:
        """Add the rank-``|j|`` change of one term whose ``axis`` map moved at ``j``."""
        name = t.use.param
        rest = {ax: index for ax, index in new.items() if ax != axis}
        b = self.other[name]
        after = _gather(b.index_select(axis, new[axis][j]), rest)
        before = _gather(b.index_select(axis, t.sources[axis][j]), rest)
        add_use_term(cached, self.ref[name].index_select(axis, j), after.sub_(before), t.use, n)
        t.sources = new


def _everything(_: str) -> bool:
    return True


def _by_param(uses: list[Use]) -> dict[str, list[Use]]:
    """``uses`` grouped by parameter, parameters in the order they first appear."""
    out: dict[str, list[Use]] = {}
    for use in uses:
        out.setdefault(use.param, []).append(use)
    return out


def _gather(x: Tensor, maps: Mapping[int, Tensor]) -> Tensor:
    """``x`` indexed by ``maps`` (axis -> source positions), skipping identity maps."""
    for axis, index in maps.items():
        if not torch.equal(index, torch.arange(index.numel(), device=index.device)):
            x = x.index_select(axis, index)
    return x
