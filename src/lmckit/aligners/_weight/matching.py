"""Data-free weight matching (Ainsworth et al., 2023, "Git Re-Basin", Alg. 1).

Maximises ``sum_p <theta_a[p], T(theta_b)[p]>`` over the spec's groups by coordinate
descent: one space at a time, holding the others fixed, the objective is linear in
that space's element, ``<T_s, C_s>`` (:mod:`lmckit.aligners._weight.similarity`), and the
space's group solves it (:meth:`lmckit.groups.Group.solve`: assignment, Procrustes,
least squares, or a semi-permutation split). Groups whose solver is exact are updated
only when the objective rises, so the objective never falls; the others (least
squares, semi-permutations) take every new element until nothing changes.

Every group is covered, rectangular ones included: when ``params_a`` is wider than
``params_b`` along a space whose group is rectangular (``SemiPermutation``,
``PaddedPermutation``, ``Orthogonal``), the space starts at the group's plain
embedding (:meth:`lmckit.groups.Group.embedding`) and the solution embeds B into A's
widths (:func:`lmckit.aligners.width_matching` is this with B the narrow model).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from lmckit.aligners._registry import register_aligner
from lmckit.aligners._result import AlignmentResult, SpaceDiagnostics
from lmckit.aligners._weight.anchored import anchored_start
from lmckit.aligners._weight.descent import coordinate_descent
from lmckit.aligners._weight.folding import fold_single_use_params
from lmckit.aligners._weight.incremental import SimilarityCache
from lmckit.aligners._weight.objective import (
    space_objective,
    sweep_limit_note,
)
from lmckit.aligners._weight.schedule import SCHEDULES, Schedule
from lmckit.aligners._weight.sharding import (
    Sharding,
    check_finite_over_ranks,
    objectives_over_ranks,
    param_bytes,
    shard_params,
    total_over_ranks,
)
from lmckit.aligners._weight.similarity import space_similarity
from lmckit.aligners._weight.start_choice import STARTS, best_start
from lmckit.aligners._weight.widths import check_init, checked_widths, space_widths, start_transform
from lmckit.data import Dataset
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import (
    Float32View,
    Params,
    meta_of,
)
from lmckit.symmetry._transform import SymmetrySpec, Transform

__all__ = [
    "GIT_REBASIN",
    "START_OPTIONS",
    "WeightMatchingConfig",
    "space_objective",
    "space_similarity",
    "space_widths",
    "weight_matching",
]

GIT_REBASIN = (
    "Ainsworth, Hayase, Srinivasa, 2023, Git Re-Basin: Merging Models modulo "
    "Permutation Symmetries, https://arxiv.org/abs/2209.04836"
)


#: Values of :attr:`WeightMatchingConfig.start`: a start, or ``"best"`` of them by data.
START_OPTIONS = (*STARTS, "best")


@dataclass(frozen=True)
class WeightMatchingConfig:
    """What to compute.

    Attributes:
        max_iter: maximum sweeps over all spaces.
        tol: a space "improves" when its objective grows by more than
            ``tol * |objective|``.
        sweep_tol: the descent also ends (converged) when a whole sweep changed the
            total objective by at most ``sweep_tol * |total|``. Continuous groups
            (orthogonal maps, rotations, scalings) approach their optimum only in the
            limit, by less each sweep; on a trained Llama pair (orthogonal residual)
            ``1e-5`` stops after 11 sweeps where ``0`` takes 24, at the same barrier to
            four decimals (BENCHMARKS.md). ``0`` sweeps on until no space improves.
        restarts: extra runs from random initial transforms; the best total wins.
        residual_circuits: spaces that attention heads read or write (the residual
            stream) compare those heads by circuits instead of raw projection weights.
        start: ``"anchored"``: begin from :func:`lmckit.aligners._weight.anchored.anchored_start`
            (spaces solved outward from the axes both models share); ``"identity"``:
            from the identity (or plain embeddings); ``"best"``: run from both and keep
            the one whose midpoint has the lower loss on a sample of training data
            (:mod:`lmckit.aligners._weight.start_choice`; needs ``model`` and ``data``). Ignored
            when ``init`` is given.
        select_targets: ``start="best"``: how many training targets (labels; tokens
            for language models) the midpoints are compared on; the default covers all
            of a small training split.
        schedule: how a sweep is cut into steps of spaces that share nothing
            (:mod:`lmckit.aligners._weight.schedule`): ``"sequential"`` keeps the sweep's
            random order, ``"coloured"`` groups the spaces into fewer, larger steps.
            With a process group the spaces of a step are solved on different processes
            (every process returns the same transform as one process would).
    """

    max_iter: int = 100
    tol: float = 1e-9
    sweep_tol: float = 1e-5
    restarts: int = 0
    residual_circuits: bool = True
    start: str = "anchored"
    select_targets: int = 32768
    schedule: Schedule = "sequential"

    def __post_init__(self) -> None:
        if (
            self.max_iter < 1
            or self.restarts < 0
            or self.tol < 0
            or self.sweep_tol < 0
            or self.select_targets < 1
        ):
            raise ValueError(f"invalid weight matching config {self}")
        if self.start not in START_OPTIONS:
            raise ValueError(f"start must be one of {', '.join(START_OPTIONS)}, got {self.start!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )


def _check_rows(
    spec: SymmetrySpec, ref: Mapping[str, Tensor], name: str, rows: Tensor, what: str
) -> None:
    """``rows`` must run along axis 0 of ``ref[name]``, an axis in no space."""
    if name not in ref:
        raise ValueError(f"{what} names {name!r}, not a float parameter of the models")
    shape = meta_of(ref, name).shape  # checked without reading the values
    if rows.shape != shape[:1]:
        raise ValueError(f"{what} of {name!r} must be a tensor over its axis 0")
    if any(u.axis % len(shape) == 0 for _, u in spec.uses_of(name)):
        raise ValueError(f"axis 0 of {name!r} is in a space; it cannot be masked or weighted")


def _weigh_rows(
    spec: SymmetrySpec,
    ref: MutableMapping[str, Tensor],
    other: MutableMapping[str, Tensor],
    row_masks: Mapping[str, Tensor] | None,
    row_weights: Mapping[str, Tensor] | None,
    sharding: Sharding,
) -> None:
    """Scale (then select) rows of the private float copies ``ref`` and ``other`` (of
    the parameters this process reads)."""
    for name, weight in (row_weights or {}).items():
        _check_rows(spec, ref, name, weight, "row weights")
        if not weight.is_floating_point() or not bool(torch.isfinite(weight).all()):
            raise ValueError(f"row weights of {name!r} must be finite floats")
        if bool((weight < 0).any()):
            raise ValueError(f"row weights of {name!r} must be non-negative")
        if not sharding.owns(name):
            continue
        # both sides scaled by sqrt(w): every product of two rows counts w times
        shape = (-1, *[1] * (ref[name].ndim - 1))
        root = weight.float().sqrt().reshape(shape).to(ref[name].device)
        ref[name], other[name] = ref[name] * root, other[name] * root
    for name, mask in (row_masks or {}).items():
        _check_rows(spec, ref, name, mask, "row mask")
        if mask.dtype != torch.bool:
            raise ValueError(f"row mask of {name!r} must be a bool tensor over its axis 0")
        if not sharding.owns(name):
            continue
        mask = mask.to(ref[name].device)
        ref[name], other[name] = ref[name][mask], other[name][mask]


def _descend_with_restarts(
    spec: SymmetrySpec,
    names: Sequence[str],
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    base: Transform,
    config: WeightMatchingConfig,
    widths: Mapping[str, int],
    seed: int,
    bar: tqdm,
    sharding: Sharding,
) -> tuple[Transform, int, bool, list[float]]:
    """Coordinate descent from ``base``, then from ``config.restarts`` random draws; the
    run with the highest total objective: ``(transform, sweeps, converged, history)``."""
    generator = torch.Generator().manual_seed(seed)
    cache = SimilarityCache(spec, ref, other, circuits=config.residual_circuits, owns=sharding.owns)
    best, sweeps, converged, history = coordinate_descent(
        spec, names, ref, other, base, config, generator, bar, cache=cache, sharding=sharding
    )
    best_total = total_over_ranks(spec, ref, other, best, sharding) if config.restarts else 0.0
    for _ in range(config.restarts):
        draw = random_transform(spec, generator, widths=widths)
        start = base.replace(**{name: draw[name] for name in names})
        cand, s2, c2, h2 = coordinate_descent(
            spec, names, ref, other, start, config, generator, bar, cache=cache,
            sharding=sharding,
        )  # fmt: skip
        total = total_over_ranks(spec, ref, other, cand, sharding)
        if total > best_total:
            best, best_total, sweeps, converged, history = cand, total, s2, c2, h2
    return best, sweeps, converged, history


@register_aligner(
    "weight_matching", paper=GIT_REBASIN, config=WeightMatchingConfig, options=("start", "max_iter")
)
def weight_matching(
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    config: WeightMatchingConfig | None = None,
    *,
    model: nn.Module | None = None,
    data: Dataset | None = None,
    seed: int = 0,
    progress: bool = False,
    device: str | torch.device | None = None,
    init: Transform | None = None,
    spaces: Sequence[str] | None = None,
    row_masks: Mapping[str, Tensor] | None = None,
    row_weights: Mapping[str, Tensor] | None = None,
) -> AlignmentResult:
    """Weight matching: align ``params_b`` to ``params_a`` by their weights alone.

    Args:
        spec: symmetry spec of the architecture (of ``params_b``'s widths).
        params_a: reference model; unchanged. It may be wider than ``params_b`` along
            spaces with rectangular groups (module docstring).
        params_b: model to align; unchanged.
        config: iterations, tolerance, restarts.
        model, data: only for ``config.start="best"`` (the architecture of
            ``params_a`` and a :class:`~lmckit.data.Dataset` whose training split
            decides the start); otherwise unused: weight matching is data-free.
        seed: order of spaces in each sweep and restart draws.
        progress: show a progress bar: the spaces solved in the current sweep, its
            number, and the objective after the last one.
        device: where the similarities are computed (default CPU); the solvers run on
            the CPU and the transform comes back there.
        init: initial transform (default identity, or plain embeddings).
        spaces: solve only these spaces (others stay at ``init``); default all.
        row_masks: per parameter, a boolean mask over its axis 0 (which must be in no
            space): only the selected rows count in the similarities, e.g. the
            embedding rows of tokens that occur in the training data (rows of tokens
            never seen stay at their initialisation and only add noise).
        row_weights: per parameter, non-negative weights over its axis 0 (in no space):
            each row's terms in the similarities are scaled by its weight, e.g. token
            frequencies for embedding and LM-head rows, so the frequent tokens decide
            the residual map. Applied before ``row_masks``.

    Returns:
        An :class:`AlignmentResult` (a :class:`~lmckit.aligners._weight.start_choice.StartChoice`
        for ``start="best"``); ``result.apply(params_b)`` is B aligned to A.
    """
    config = config or WeightMatchingConfig()
    if config.start == "best" and init is None:

        def run(start: str) -> AlignmentResult:
            return weight_matching(spec, params_a, params_b, replace(config, start=start),
                                   seed=seed, progress=progress, device=device, spaces=spaces,
                                   row_masks=row_masks, row_weights=row_weights)  # fmt: skip

        return best_start(run, params_a, params_b, model=model, data=data,
                          targets=config.select_targets, seed=seed)  # fmt: skip
    widths = checked_widths(spec, params_a, params_b)
    names = list(spec.names if spaces is None else spaces)
    for name in names:
        spec[name]  # noqa: B018  (raises KeyError naming the valid spaces)
    start = start_transform(spec, widths)
    if init is not None:
        check_init(spec, init, start)
    # across processes each reads only its share of the parameters (module sharding)
    sharding = shard_params(spec, param_bytes(params_b), circuits=config.residual_circuits)
    check_finite_over_ranks(params_a, params_b, sharding)
    begin = time.perf_counter()
    dev = torch.device(device or "cpu")
    # compared in float32, cast tensor by tensor as read: never a float32 copy of a
    # bfloat16 pair
    ref: MutableMapping[str, Tensor] = Float32View(params_a, dev)
    other: MutableMapping[str, Tensor] = Float32View(params_b, dev)
    if dev.type != "cpu":  # on an accelerator every read would be a transfer: copy once
        ref, other = dict(ref), dict(other)
    _weigh_rows(spec, ref, other, row_masks, row_weights, sharding)
    fold_single_use_params(spec, ref, other, owns=sharding.owns)
    base = init or start
    if init is None and config.start != "identity":
        base = anchored_start(spec, ref, other, start, names=names, sharding=sharding)
    bar = tqdm(desc="weight matching", unit="space", disable=not progress, leave=False)
    try:
        best, sweeps, converged, history = _descend_with_restarts(
            spec, names, ref, other, base, config, widths, seed, bar, sharding
        )
    finally:
        bar.close()

    # identity elements left out: applying them would cost products for nothing
    moved = Transform(spec, {s.name: start[s.name] for s in spec if widths[s.name] != s.n})
    before = objectives_over_ranks(spec, names, ref, other, moved, sharding)
    after = objectives_over_ranks(spec, names, ref, other, best, sharding)
    diagnostics = {name: SpaceDiagnostics(before[name], after[name]) for name in names}
    return AlignmentResult(
        transform=best,
        spaces=diagnostics,
        iterations=sweeps,
        converged=converged,
        seconds=time.perf_counter() - begin,
        history=history,
        stop="" if converged else sweep_limit_note(history, config.max_iter),
    )
