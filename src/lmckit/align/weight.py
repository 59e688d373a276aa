"""Data-free weight matching (Ainsworth et al., 2023, "Git Re-Basin", Alg. 1).

Maximises ``sum_p <theta_a[p], T(theta_b)[p]>`` over the spec's groups by coordinate
descent: one space at a time, holding the others fixed, the objective is linear in
that space's element, ``<T_s, C_s>`` with ``C_s = sum_{uses u} A_u B_u^T`` where
``B_u`` is the other model's parameter with the *other* spaces' elements applied.
Each group's solver (assignment, Procrustes, least squares) maximises it exactly.

Transformers: heads are compared by their QK/OV circuits, and a space the heads read
from or write to (the residual stream) sees them through those circuits too, not
through the raw projections, whose within-head bases differ between models
(:func:`lmckit.align.circuits.residual_circuit_similarity`; the circuit terms are
quadratic in the residual map, so each update solves their linearisation at the
current map).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from lmckit.align.circuits import head_similarity_matrix, residual_circuit_similarity
from lmckit.align.result import AlignmentResult, SpaceDiagnostics
from lmckit.align.solvers import objective, solve
from lmckit.params import Params, check_compatible, check_finite
from lmckit.symmetry import (
    Invertible,
    Space,
    SymmetrySpec,
    Transform,
    Use,
    apply_to_param,
    random_transform,
)

__all__ = ["WeightMatchingConfig", "space_similarity", "weight_matching"]


@dataclass(frozen=True)
class WeightMatchingConfig:
    """What to compute.

    Attributes:
        max_iter: maximum sweeps over all spaces.
        tol: a space "improves" when its objective grows by more than
            ``tol * |objective|``.
        restarts: extra runs from random initial transforms; the best total wins.
        residual_circuits: spaces that attention heads read or write (the residual
            stream) compare those heads by circuits instead of raw projection weights.
    """

    max_iter: int = 100
    tol: float = 1e-9
    restarts: int = 0
    residual_circuits: bool = True

    def __post_init__(self) -> None:
        if self.max_iter < 1 or self.restarts < 0 or self.tol < 0:
            raise ValueError(f"invalid weight matching config {self}")


def _unit_major(x: Tensor, use: Use, n: int) -> Tensor:
    """``(n, -1)`` view of a parameter with the space's units first."""
    moved = x.movedim(use.axis % x.ndim, 0)
    blocked = moved.reshape(use.outer, n, -1)
    return blocked.transpose(0, 1).reshape(n, -1)


def space_similarity(
    spec: SymmetrySpec,
    space: Space,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
    *,
    with_gram: bool = False,
    circuits: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """``C_s = sum_u A_u B_u^T`` with the other spaces' elements applied to B.

    With ``circuits``, the uses of attention projections by a space that is not a head
    space (see the module docstring) are replaced by the heads' circuit terms,
    linearised at the space's element in ``transform``.

    Returns:
        ``(C, G)``: ``C`` is ``(m, n)`` (reference units x other units); ``G`` is the
        other model's writer Gram ``sum_{writers} B_u B_u^T`` (``(n, n)``) when
        ``with_gram``, else ``None``.
    """
    if space.circuits is not None:
        # attention heads are compared through their QK/OV circuits (align.circuits)
        moved = {
            p: apply_to_param(spec, p, other[p], transform, skip=space.name) for p in space.params
        }
        return head_similarity_matrix(space, ref, moved), None
    sim: Tensor | None = None
    gram: Tensor | None = None
    replaced: set[str] = set()
    if circuits and not isinstance(space.group, Invertible):
        sim, replaced = _circuit_terms(spec, space, ref, other, transform)
    for use in space.uses:
        if not use.compare or use.param in replaced:
            continue
        # the space's own element stays on its other axes of this parameter (both sides
        # of a QK circuit): the term is the objective's linearisation at that element
        b = apply_to_param(spec, use.param, other[use.param], transform, skip_use=use)
        a = ref[use.param]
        if any(b.shape[i] != a.shape[i] for i in range(a.ndim) if i != use.axis % a.ndim):
            continue  # a rectangular space's square start: left to the next sweep
        b_mat = _unit_major(b, use, space.n)
        m = a.shape[use.axis % a.ndim] // (use.outer * use.inner)
        a_mat = _unit_major(a, use, m)
        term = a_mat @ b_mat.T
        sim = term if sim is None else sim + term
        if with_gram and use.role == "write":
            g = b_mat @ b_mat.T
            gram = g if gram is None else gram + g
    assert sim is not None  # a spec's spaces always have uses
    return sim, gram


def _circuit_terms(
    spec: SymmetrySpec,
    space: Space,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
) -> tuple[Tensor | None, set[str]]:
    """Circuit similarity of every head space that ``space`` feeds or is fed by.

    Returns the summed ``(m, n)`` term (``None`` if no head space touches ``space``) and
    the parameters whose raw uses it replaces.
    """
    reads = {u.param for u in space.uses if u.role == "read"}
    writes = {u.param for u in space.uses if u.role == "write"}
    total: Tensor | None = None
    replaced: set[str] = set()
    current: Tensor | None = None  # built only if a head space touches this space
    for heads in spec:
        c = heads.circuits
        if c is None or heads.name == space.name:
            continue
        projections = {c.query.param, c.key.param, c.value.param}
        inputs, outputs = bool(projections & reads), c.output in writes
        if not (inputs or outputs):
            continue
        replaced |= (projections if inputs else set()) | ({c.output} if outputs else set())
        if current is None:
            current = space.group.matrix(transform[space.name])
        a_width = ref[c.output].shape[0] if outputs else ref[c.query.param].shape[1]
        b_width = other[c.output].shape[0] if outputs else other[c.query.param].shape[1]
        if tuple(current.shape) != (a_width, b_width):
            continue  # a rectangular space's square start: raw-free linear terms first
        moved = {
            p: apply_to_param(spec, p, other[p], transform, skip=space.name) for p in heads.params
        }
        term = residual_circuit_similarity(
            heads, ref, moved, current, inputs=inputs, outputs=outputs
        )
        total = term if total is None else total + term
    return total, replaced


def _fold_single_use_params(
    spec: SymmetrySpec, ref: dict[str, Tensor], other: dict[str, Tensor]
) -> None:
    """Replace large parameters that only one space touches by an exact small surrogate.

    A matrix ``X`` (``(rows, n)`` with its space on axis 1, e.g. a token embedding)
    enters every similarity and the objective only through ``A^T B``, linearly in B's
    space axis. ``A' = I_m`` and ``B' = A^T B`` (both ``m`` rows) give the same terms,
    so the ``rows``-sized product is computed once instead of at every step.
    Skipped for least-squares spaces, whose Gram needs ``B^T B``.
    """
    for name in list(ref):
        uses = spec.uses_of(name)
        if len(uses) != 1 or name not in other:
            continue
        space, use = uses[0]
        a, b = ref[name], other[name]
        if a.ndim != 2 or use.axis % 2 != 1 or use.outer != 1 or use.inner != 1:
            continue
        if isinstance(space.group, Invertible) or a.shape[0] <= a.shape[1]:
            continue
        ref[name] = torch.eye(a.shape[1], dtype=a.dtype)
        other[name] = (a.double().T @ b.double()).to(b.dtype)


def _coordinate_descent(
    spec: SymmetrySpec,
    names: Sequence[str],
    ref: Params,
    other: Params,
    init: Transform,
    config: WeightMatchingConfig,
    generator: torch.Generator,
    bar: tqdm,
) -> tuple[Transform, int, bool, list[float]]:
    """Sweep over ``names`` in random order until no space improves.

    Returns the transform, the number of sweeps, whether it converged, and the sum of
    the solved spaces' objectives after each sweep.
    """
    transform = init
    current: dict[str, float] = {}
    history: list[float] = []
    for sweep in range(1, config.max_iter + 1):
        improved = False
        for idx in torch.randperm(len(names), generator=generator).tolist():
            space = spec[names[idx]]
            # least squares is not a maximiser of <T, C>: accept its answer as is
            least_squares = isinstance(space.group, Invertible)
            sim, gram = space_similarity(
                spec,
                space,
                ref,
                other,
                transform,
                with_gram=least_squares,
                circuits=config.residual_circuits,
            )
            element = solve(space.group, sim, gram=gram)
            new = objective(space.group, element, sim)
            # a rectangular space starts from a square element (the identity) that does
            # not fit its (m, n) similarity: the first solution is always taken
            fits = space.group.dims(transform[space.name]) == tuple(sim.shape)
            old = objective(space.group, transform[space.name], sim) if fits else new
            gain = not fits or new > old + config.tol * max(abs(old), 1.0)
            if gain or least_squares:
                transform = transform.replace(**{space.name: element})
            improved = improved or gain
            current[space.name] = new if gain or least_squares else old
        history.append(sum(current.values()))
        bar.update(1)
        bar.set_postfix(objective=f"{history[-1]:.5g}")
        if not improved:
            return transform, sweep, True, history
    return transform, config.max_iter, False, history


def _space_objective(
    spec: SymmetrySpec, space: Space, ref: Params, other: Params, transform: Transform
) -> float:
    """``<T_s, C_s>`` of one space under ``transform`` (NaN if the widths differ).

    For unit-moving and orthogonal groups this is ``sum_u <A_u, T(B)_u>`` over the
    space's uses, an elementwise inner product that needs no ``n x n`` product; head
    spaces compared by circuits and least-squares spaces go through the similarity.
    """
    if space.circuits is not None or isinstance(space.group, Invertible):
        sim, _ = space_similarity(spec, space, ref, other, transform)
        element = transform[space.name]
        if space.group.dims(element) != tuple(sim.shape):
            return float("nan")
        return objective(space.group, element, sim)
    total = 0.0
    for use in (u for u in space.uses if u.compare):
        b = apply_to_param(spec, use.param, other[use.param], transform)
        if b.shape != ref[use.param].shape:
            return float("nan")
        total += float((ref[use.param].double() * b.double()).sum())
    return total


def _total(spec: SymmetrySpec, ref: Params, other: Params, transform: Transform) -> float:
    total = 0.0
    for name in {u.param for s in spec for u in s.uses if u.compare}:
        b = apply_to_param(spec, name, other[name], transform)
        if b.shape == ref[name].shape:
            total += float((ref[name].double() * b.double()).sum())
    return total


def _check_rows(
    spec: SymmetrySpec, ref: Mapping[str, Tensor], name: str, rows: Tensor, what: str
) -> None:
    """``rows`` must run along axis 0 of ``ref[name]``, an axis in no space."""
    if name not in ref or rows.shape != ref[name].shape[:1]:
        raise ValueError(f"{what} of {name!r} must be a tensor over its axis 0")
    if any(u.axis % ref[name].ndim == 0 for _, u in spec.uses_of(name)):
        raise ValueError(f"axis 0 of {name!r} is in a space; it cannot be masked or weighted")


def weight_matching(
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    config: WeightMatchingConfig | None = None,
    *,
    init: Transform | None = None,
    spaces: Sequence[str] | None = None,
    seed: int = 0,
    progress: bool = False,
    row_masks: Mapping[str, Tensor] | None = None,
    row_weights: Mapping[str, Tensor] | None = None,
) -> AlignmentResult:
    """Align ``params_b`` to ``params_a`` by weight matching.

    Args:
        spec: symmetry spec of the architecture (of ``params_b``'s widths).
        params_a: reference model; unchanged.
        params_b: model to align; unchanged.
        config: iterations, tolerance, restarts.
        init: initial transform (default identity).
        spaces: solve only these spaces (others stay at ``init``); default all.
        seed: order of spaces in each sweep and restart draws.
        progress: show a progress bar over sweeps.
        row_masks: per parameter, a boolean mask over its axis 0 (which must be in no
            space): only the selected rows count in the similarities, e.g. the
            embedding rows of tokens that occur in the training data (rows of tokens
            never seen stay at their initialisation and only add noise).
        row_weights: per parameter, non-negative weights over its axis 0 (in no space):
            each row's terms in the similarities are scaled by its weight, e.g. token
            frequencies for embedding and LM-head rows, so the frequent tokens decide
            the residual map. Applied before ``row_masks``.

    Returns:
        An :class:`AlignmentResult`; ``apply(spec, params_b, result.transform)``.
    """
    config = config or WeightMatchingConfig()
    # compatibility first: models of different widths must be reported as such (naming
    # the first mismatched parameter), not as a spec that does not fit one of them
    if any(s.group.rectangular for s in spec):
        # widths may differ along rectangular spaces; names must still agree
        check_compatible(
            {k: v.flatten()[:0] for k, v in params_a.items()},
            {k: v.flatten()[:0] for k, v in params_b.items()},
        )
    else:
        check_compatible(params_a, params_b)
    spec.validate(params_b)
    check_finite(params_a, what="first model")
    check_finite(params_b, what="second model")
    names = list(spec.names if spaces is None else spaces)
    for name in names:
        spec[name]  # noqa: B018  (raises KeyError naming the valid spaces)
    start = time.perf_counter()
    ref = {k: v.detach().float() for k, v in params_a.items() if v.is_floating_point()}
    other = {k: v.detach().float() for k, v in params_b.items() if v.is_floating_point()}
    for name, weight in (row_weights or {}).items():
        _check_rows(spec, ref, name, weight, "row weights")
        if not weight.is_floating_point() or not bool(torch.isfinite(weight).all()):
            raise ValueError(f"row weights of {name!r} must be finite floats")
        if bool((weight < 0).any()):
            raise ValueError(f"row weights of {name!r} must be non-negative")
        # both sides scaled by sqrt(w): every product of two rows counts w times
        root = weight.float().sqrt().reshape(-1, *[1] * (ref[name].ndim - 1))
        ref[name], other[name] = ref[name] * root, other[name] * root
    for name, mask in (row_masks or {}).items():
        _check_rows(spec, ref, name, mask, "row mask")
        if mask.dtype != torch.bool:
            raise ValueError(f"row mask of {name!r} must be a bool tensor over its axis 0")
        ref[name], other[name] = ref[name][mask], other[name][mask]
    _fold_single_use_params(spec, ref, other)
    base = init or Transform.identity(spec)
    generator = torch.Generator().manual_seed(seed)

    bar = tqdm(desc="weight matching", unit="sweep", disable=not progress, leave=False)
    try:
        best, sweeps, converged, history = _coordinate_descent(
            spec, names, ref, other, base, config, generator, bar
        )
        best_total = _total(spec, ref, other, best) if config.restarts else 0.0
        for _ in range(config.restarts):
            draw = random_transform(spec, generator)
            init_r = base.replace(**{name: draw[name] for name in names})
            cand, s2, c2, h2 = _coordinate_descent(
                spec, names, ref, other, init_r, config, generator, bar
            )
            total = _total(spec, ref, other, cand)
            if total > best_total:
                best, best_total, sweeps, converged, history = cand, total, s2, c2, h2
    finally:
        bar.close()

    diagnostics = {
        name: SpaceDiagnostics(
            _space_objective(spec, spec[name], ref, other, Transform.identity(spec)),
            _space_objective(spec, spec[name], ref, other, best),
        )
        for name in names
    }
    return AlignmentResult(
        transform=best,
        spaces=diagnostics,
        iterations=sweeps,
        converged=converged,
        seconds=time.perf_counter() - start,
        history=history,
    )
