"""One space's linear subproblem: the similarity ``C`` (and what its solver needs).

With every other space's element held fixed, the weight-matching objective
``sum_p <theta_a[p], T(theta_b)[p]>`` is linear in one space's element ``T_s``:
``<T_s, C_s>`` with ``C_s = sum_{uses u} A_u B_u^T``, where ``B_u`` is the other
model's parameter with the *other* spaces' elements applied and both sides are laid
out with the space's units first. Least-squares groups get the writers' terms only
and the other model's writer Gram ``G = sum_w B_w B_w^T``; groups that compare units
by cosine get the unit norms.

Transformers: heads are compared by their QK/OV circuits, and a space the heads read
from or write to (the residual stream) sees them through those circuits too, not
through the raw projections, whose within-head bases differ between models
(:func:`lmckit.aligners._weight.circuits.residual_circuit_similarity`; the circuit terms are
quadratic in the residual map, so each update solves their linearisation at the
current map).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import torch
from torch import Tensor

from lmckit.aligners._weight.circuits import (
    Reading,
    circuit_params,
    head_counts,
    head_similarity_matrix,
    residual_circuit_similarity,
)
from lmckit.groups._base import Subproblem
from lmckit.symmetry._spaces import Part, region
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform, Use, apply_to_param

__all__ = [
    "Subproblem",
    "add_use_term",
    "circuit_partners",
    "circuit_terms",
    "moved_region",
    "space_problem",
    "space_similarity",
    "unit_major",
    "use_width",
]

#: named tensors of one model (its float parameters)
Named = Mapping[str, Tensor]


def unit_major(x: Tensor, use: Use, n: int) -> Tensor:
    """``(n, K)`` matrix of a parameter's use region (:meth:`~lmckit.symmetry.Use.region`)
    with the space's units first (a view when the layout allows, e.g. the transpose of a
    reader's weight; products take it as is)."""
    x = use.region(x)
    moved = x.movedim(use.axis % x.ndim, 0)
    blocked = moved.reshape(use.outer, n, -1)
    return blocked.transpose(0, 1).reshape(n, -1)


def use_width(x: Tensor, use: Use) -> int:
    """How many units of its space a use of parameter ``x`` holds."""
    shape = use.region_shape(x.shape)
    return shape[use.axis % len(shape)] // (use.outer * use.inner)


def moved_region(
    spec: SymmetrySpec,
    param: str,
    parts: tuple[Part, ...],
    value: Tensor,
    transform: Transform,
    *,
    skip: str | None = None,
    skip_use: tuple[str, Use] | None = None,
) -> Tensor:
    """``region(apply_to_param(spec, param, value, transform, ...), parts)``: a slice of
    B's parameter with the other spaces applied (``skip``, ``skip_use`` as for
    :func:`~lmckit.symmetry._transform.apply_to_param`).

    Spaces that act across the slice (on an axis it does not narrow, over the whole
    axis) commute with narrowing, so they act on the slice alone: a query group's rows
    of ``q_proj`` are rotated by the residual map, not the whole projection.
    """

    def moved(x: Tensor, uses: list[tuple[Space, Use]] | None = None) -> Tensor:
        return apply_to_param(spec, param, x, transform, skip=skip, skip_use=skip_use, uses=uses)

    if not parts:
        return moved(value)
    ndim = value.ndim
    narrowed = {p.axis % ndim for p in parts}
    inside: list[tuple[Space, Use]] = []
    across: list[tuple[Space, Use]] = []
    for space, other in spec.uses_of(param):
        touched = {other.axis % ndim} | {p.axis % ndim for p in other.parts}
        (inside if touched & narrowed else across).append((space, other))
    # an axis that some use inside acts on or slices: what acts across must not touch it
    held = {other.axis % ndim for _, other in inside}
    held |= {p.axis % ndim for _, other in inside for p in other.parts}
    if any(other.parts or other.axis % ndim in held for _, other in across):
        return region(moved(value), parts)
    return moved(region(moved(value, inside), parts), across)


def _moved_circuit_params(
    spec: SymmetrySpec, space: Space, other: Named, transform: Transform
) -> dict[str, Tensor]:
    """B's parameters that head space ``space``'s circuits read, every other space applied.

    A space nested in one unit of a head space reads the rows of that unit's heads only
    (:func:`~lmckit.aligners._weight.circuits.head_similarity_matrix`): where those rows
    are one slice of their parameter, only they are moved (:func:`moved_region`) and
    the rest is left zero, unread."""
    # fused projections (one ``qkv`` weight) are named once per role: read once
    values = {p: other[p] for p in dict.fromkeys(circuit_params(space.circuits))}
    slices = _unit_slices(space, {p: v.shape for p, v in values.items()})
    out = {}
    for p, value in values.items():
        part = slices.get(p)
        if part is None:
            out[p] = apply_to_param(spec, p, value, transform, skip=space.name)
            continue
        full = torch.zeros_like(value)
        moved = moved_region(spec, p, (part,), value, transform, skip=space.name)
        region(full, (part,)).copy_(moved)
        out[p] = full
    return out


def _unit_slices(space: Space, shapes: Mapping[str, torch.Size]) -> dict[str, Part]:
    """Per parameter, the one slice that holds what a head space nested in one unit
    compares: its query heads' rows, their key/value heads' rows, their output columns.
    Parameters whose rows are not one slice (heads interleaved) or that hold several
    projections (fused QKV) are left out."""
    circuits = space.circuits
    if circuits is None or space.nest is None or space.nest.unit is None:
        return {}
    _, heads, kv_heads = head_counts(space)
    per = space.group.units(space.n) or 1
    span = (space.nest.unit * per, (space.nest.unit + 1) * per)
    group = heads // kv_heads
    kv_span = (span[0] // group, (span[1] - 1) // group + 1)
    wanted = [
        (part, count, rows)
        for part, count, rows in (
            (circuits.query, heads, span), (circuits.query_bias, heads, span),
            (circuits.key, kv_heads, kv_span), (circuits.key_bias, kv_heads, kv_span),
            (circuits.value, kv_heads, kv_span), (circuits.value_bias, kv_heads, kv_span),
        )
        if part is not None
    ]  # fmt: skip
    found: dict[str, list[Part | None]] = {}
    for part, count, (lo, hi) in wanted:
        axis = 1 if part.transposed else 0
        index = part.index(shapes[part.param][axis], count)
        rows = None
        if isinstance(index, slice):
            width = (index.stop - index.start) // count
            rows = Part(axis, index.start + lo * width, (hi - lo) * width)
        found.setdefault(part.param, []).append(rows)
    axis = 0 if circuits.output_transposed else 1  # the output's columns, head by head
    width = shapes[circuits.output][axis] // heads
    found.setdefault(circuits.output, []).append(Part(axis, span[0] * width, per * width))
    return {p: got[0] for p, got in found.items() if len(got) == 1 and got[0] is not None}


def add_use_term(
    total: Tensor | None, a: Tensor, b: Tensor, use: Use, n: int, *, diagonal: bool = False
) -> Tensor:
    """``total + A_u B_u^T`` for parameters ``a`` (reference) and ``b`` (other, already
    moved by the other spaces) of one use; ``total`` (if given) is updated in place.
    With ``diagonal``, only the product's ``(n,)`` diagonal."""
    a_mat, b_mat = unit_major(a, use, use_width(a, use)), unit_major(b, use, n)
    if diagonal:
        return _add(total, _row_products(a_mat, b_mat))
    if total is None:
        return a_mat @ b_mat.T
    return total.addmm_(a_mat, b_mat.T)


def _row_products(a_mat: Tensor, b_mat: Tensor) -> Tensor:
    """The diagonal of ``a_mat @ b_mat.T``: each row's inner product, ``(n,)``."""
    # not einsum: on a transposed view (a reader's unit-major matrix) it runs a batched
    # product per row, 3-20x slower than this elementwise reduction
    return torch.linalg.vecdot(a_mat, b_mat, dim=1)


def _gram(b_mat: Tensor, diagonal: bool) -> Tensor:
    """``b_mat @ b_mat.T``, or its diagonal (each row's squared norm)."""
    return _row_products(b_mat, b_mat) if diagonal else b_mat @ b_mat.T


def _add(total: Tensor | None, term: Tensor) -> Tensor:
    return term if total is None else total.add_(term)


def space_problem(
    spec: SymmetrySpec,
    space: Space,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
    *,
    circuits: bool = True,
    with_gram: bool = False,
    diagonals: bool | None = None,
) -> Subproblem:
    """The subproblem of ``space`` with ``transform``'s other elements applied to B.

    Args:
        spec: the spec; ``space`` one of its spaces.
        ref, other: the two models' float parameters (``other`` untransformed).
        transform: current elements; ``space``'s own element is used only to
            linearise terms in which it appears twice (circuits, QK-like uses).
        circuits: replace raw attention projections by circuit terms (module docstring).
        with_gram: also return the writer Gram for a group that does not need it.
        diagonals: give the square matrices by their ``(n,)`` diagonals (default: when
            the group reads nothing else, :attr:`~lmckit.groups.Group.unitwise`).
    """
    group = space.group
    diagonal = group.unitwise if diagonals is None else diagonals
    if space.circuits is not None:
        # attention heads are compared through their QK/OV circuits (aligners.weight.circuits)
        moved = _moved_circuit_params(spec, space, other, transform)
        # units that are key/value groups pair their query heads as well as the spec
        # lets them: best pairing if nested head spaces permute them, else in order
        within = any(s.circuits is not None for s in spec.nested_in(space.name))
        return Subproblem(head_similarity_matrix(space, ref, moved, within=within))
    sim: Tensor | None = None
    gram: Tensor | None = None
    sq_a: Tensor | None = None
    sq_b: Tensor | None = None
    replaced: frozenset[str] = frozenset()
    if circuits and not group.least_squares:
        sim, replaced = circuit_terms(spec, space, ref, other, transform)
        if diagonal and sim is not None:
            sim = torch.diagonal(sim).clone()
    read_sim: Tensor | None = None
    read_gram: Tensor | None = None
    for use in space.uses:
        if not use.compare or use.param in replaced:
            continue
        if group.least_squares and use.role != "write":
            if group.fits_readers and use.role == "read":
                a, b, flat = _use_operands(spec, space, use, ref, other, transform)
                read_sim = add_use_term(read_sim, a, b, flat, space.n, diagonal=diagonal)
                read_gram = _add(read_gram, _gram(unit_major(b, flat, space.n), diagonal))
            continue  # least squares fits the writers (readers move by T^{-T})
        # the space's own element stays on its other axes of this parameter (both sides
        # of a QK circuit): the term is the objective's linearisation at that element
        a, b, flat = _use_operands(spec, space, use, ref, other, transform)
        sim = add_use_term(sim, a, b, flat, space.n, diagonal=diagonal)
        if (with_gram or group.least_squares) and use.role == "write":
            gram = _add(gram, _gram(unit_major(b, flat, space.n), diagonal))
        if group.needs_norms:
            m = use_width(a, flat)
            sq_a = _add(sq_a, unit_major(a, flat, m).double().pow(2).sum(1))
            sq_b = _add(sq_b, unit_major(b, flat, space.n).double().pow(2).sum(1))
    if sim is None:
        raise ValueError(f"space {space.name!r} has no use to compare the two models on")
    norms = None if sq_a is None or sq_b is None else (sq_a.sqrt(), sq_b.sqrt())
    readers = None if read_sim is None or read_gram is None else (read_sim, read_gram)
    return Subproblem(sim, gram, norms, readers)


def _use_operands(
    spec: SymmetrySpec, space: Space, use: Use, ref: Named, other: Named, transform: Transform
) -> tuple[Tensor, Tensor, Use]:
    """A's and moved B's regions of one use of ``space``, and the use with no parts left
    to narrow (:func:`moved_region`)."""
    value = other[use.param]
    b = moved_region(spec, use.param, use.parts, value, transform, skip_use=(space.name, use))
    return use.region(ref[use.param]), b, replace(use, parts=())


def space_similarity(
    spec: SymmetrySpec,
    space: Space,
    ref: Named,
    other: Named,
    transform: Transform,
    **options: bool,
) -> tuple[Tensor, Tensor | None]:
    """``(C, G)`` of :func:`space_problem` (same arguments): ``C`` is ``(m, n)``, ``G``
    the other model's writer Gram ``(n, n)`` with ``with_gram`` (or when the group
    needs it), else ``None``."""
    problem = space_problem(spec, space, ref, other, transform, diagonals=False, **options)
    return problem.sim, problem.gram


def circuit_partners(
    spec: SymmetrySpec, space: Space
) -> tuple[list[tuple[Space, Reading, bool]], frozenset[str]]:
    """Head spaces that ``space`` feeds (``inputs``) or is fed by (``outputs``).

    Returns ``(heads, inputs, outputs)`` per such head space, ``inputs`` saying which of
    the query, key and value projections read ``space`` (all three read the residual
    stream; a latent of multi-head latent attention feeds the queries alone, or the
    keys and values), and the parameters whose raw uses of ``space`` their circuit
    terms replace.
    """
    reads = {u.param for u in space.uses if u.role == "read"}
    writes = {u.param for u in space.uses if u.role == "write"}
    partners: list[tuple[Space, Reading, bool]] = []
    replaced: set[str] = set()
    for heads in spec:
        c = heads.circuits
        # nested head spaces share their parent's circuits: counted once, by the parent
        if c is None or heads.name == space.name or heads.nest is not None:
            continue
        parts = (c.query.param, c.key.param, c.value.param)
        q, k, v = (p in reads for p in parts)
        inputs, outputs = (q, k, v), c.output in writes
        if not (any(inputs) or outputs):
            continue
        replaced |= {p for p in parts if p in reads} | ({c.output} if outputs else set())
        partners.append((heads, inputs, outputs))
    return partners, frozenset(replaced)


def circuit_terms(
    spec: SymmetrySpec,
    space: Space,
    ref: Mapping[str, Tensor],
    other: Mapping[str, Tensor],
    transform: Transform,
    *,
    owns: Callable[[str], bool] | None = None,
) -> tuple[Tensor | None, frozenset[str]]:
    """Circuit similarity of every head space that ``space`` feeds or is fed by.

    Returns the summed ``(m, n)`` term (``None`` if no head space touches ``space``) and
    the parameters whose raw uses it replaces. With ``owns``, only the heads whose
    output projection it owns are summed (the rest are another process's).
    """
    partners, replaced = circuit_partners(spec, space)
    total: Tensor | None = None
    current: Tensor | None = None  # built only if a head space touches this space
    for heads, inputs, outputs in partners:
        if owns is not None and not owns(heads.circuits.output):  # type: ignore[union-attr]
            continue
        if current is None:
            device = ref[heads.circuits.output].device  # type: ignore[union-attr]
            current = space.group.matrix(transform[space.name]).to(device, torch.float32)
        moved = {
            p: apply_to_param(spec, p, other[p], transform, skip=space.name)
            for p in circuit_params(heads.circuits)
        }
        term = residual_circuit_similarity(
            heads, ref, moved, current, inputs=inputs, outputs=outputs
        )
        total = _add(total, term)
    return total, replaced
