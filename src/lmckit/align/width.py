"""Width-heterogeneous alignment: embed a narrow model into a wide one, then match.

A narrow model (``n`` units in a space) is embedded into a wide one (``m >= n``
units) by a rectangular group element ``T`` (``m x n``) that leaves its function
unchanged, chosen so the embedded model is close to the wide model:

- :class:`~lmckit.symmetry.SemiPermutation` for positively homogeneous units (ReLU):
  every wide unit copies one narrow unit, the writer row scaled by ``c_i > 0`` with
  ``sum_{i -> j} c_i = 1``; ``relu(c x) = c relu(x)`` makes the split exact. Chosen by
  a rectangular assignment (each narrow unit gets one wide unit), then every leftover
  wide unit joins the narrow unit it resembles most (cosine of weights).
- :class:`PaddedPermutation` for any unit type (GELU FFN neurons, ...): the narrow
  units go to ``n`` distinct wide slots, the other ``m - n`` wide units get zero
  writers and readers, so they output ``act(0) * 0 = 0``. Chosen by rectangular
  assignment.
- :class:`~lmckit.symmetry.Orthogonal` with ``m > n`` for linear spaces (residual
  streams of RMSNorm transformers): orthonormal columns, ``O^T O = I``; solved by
  Procrustes on the ``m x n`` similarity (``U V^T``).
- Square groups where widths agree are solved as in weight matching.

The spec passed in is the *narrow* model's spec with these groups (``spec.with_groups``);
``apply(spec, narrow_params, result.transform)`` gives params of the wide shape, to be
run through the wide model's module (e.g. from ``lmckit.models.create_model`` with the
wide configuration).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor
from tqdm.auto import tqdm

from lmckit.align.result import AlignmentResult, SpaceDiagnostics
from lmckit.align.solvers import solve
from lmckit.params import Params, check_finite
from lmckit.symmetry import (
    Group,
    Orthogonal,
    Role,
    SemiPermutation,
    SemiPermutationElement,
    Space,
    SymmetrySpec,
    Transform,
    apply_to_param,
)

__all__ = [
    "PaddedPermutation",
    "PaddedPermutationElement",
    "WidthMatchingConfig",
    "naive_embedding",
    "space_widths",
    "width_matching",
]

Coefficients = Literal["uniform", "similarity"]


@dataclass(frozen=True)
class PaddedPermutationElement:
    """Injective ``m x n`` 0/1 matrix: narrow unit ``j`` goes to wide slot ``slots[j]``."""

    slots: Tensor  # (n,) long, distinct values in [0, m)
    m: int

    def matrix(self) -> Tensor:
        n = self.slots.numel()
        mat = torch.zeros(self.m, n, dtype=torch.float64)
        mat[self.slots, torch.arange(n)] = 1.0
        return mat


@dataclass(frozen=True)
class PaddedPermutation(Group):
    """Zero-padding embeddings with a permutation: ``T = P[:, slots]`` (``m x n``).

    Writers are placed in the chosen wide slots, zero elsewhere; readers likewise
    (``T`` has orthonormal columns, so the left inverse is ``T^T`` and the reader
    matrix is ``T`` itself). Valid for any activation with ``act(0) = 0`` and any unit
    type whose extra units may be silent; not for elementwise parameters (norms).
    """

    rectangular = True
    elementwise_ok = False

    def identity(self, n: int) -> PaddedPermutationElement:
        return PaddedPermutationElement(torch.arange(n), n)

    def random(
        self, n: int, generator: torch.Generator, *, m: int | None = None
    ) -> PaddedPermutationElement:
        m = n if m is None else m
        if m < n:
            raise ValueError(f"a padded permutation embeds {n} units into m >= n, got m={m}")
        return PaddedPermutationElement(torch.randperm(m, generator=generator)[:n], m)

    def compose(
        self, second: PaddedPermutationElement, first: PaddedPermutationElement
    ) -> PaddedPermutationElement:
        return PaddedPermutationElement(second.slots[first.slots], second.m)

    def inverse(self, element: PaddedPermutationElement) -> PaddedPermutationElement:
        if element.m != element.slots.numel():
            raise ValueError("a rectangular padded permutation has no inverse")
        return PaddedPermutationElement(torch.argsort(element.slots), element.m)

    def matrix(self, element: PaddedPermutationElement) -> Tensor:
        return element.matrix()

    def dims(self, element: PaddedPermutationElement) -> tuple[int, int]:
        return element.m, element.slots.numel()

    def act(self, x: Tensor, element: PaddedPermutationElement, role: Role) -> Tensor:
        if role == "elementwise":
            raise ValueError("PaddedPermutation cannot act on elementwise parameters")
        out = x.new_zeros(x.shape[0], element.m, x.shape[2])
        return out.index_copy(1, element.slots.to(x.device), x)

    def reader_matrix(self, element: PaddedPermutationElement) -> Tensor:
        return element.matrix()


@dataclass(frozen=True)
class WidthMatchingConfig:
    """What to compute.

    Attributes:
        max_iter: maximum sweeps over all spaces; a sweep that changes no element stops.
        coefficients: semi-permutation split coefficients: ``uniform`` (``1 / k`` for a
            narrow unit split into ``k`` wide units) or ``similarity`` (proportional to
            each wide unit's cosine similarity with its narrow unit, clipped at 0.05).
    """

    max_iter: int = 30
    coefficients: Coefficients = "uniform"

    def __post_init__(self) -> None:
        if self.max_iter < 1:
            raise ValueError(f"max_iter must be >= 1, got {self.max_iter}")
        if self.coefficients not in ("uniform", "similarity"):
            raise ValueError(
                f"coefficients must be 'uniform' or 'similarity', got {self.coefficients!r}"
            )


def space_widths(spec: SymmetrySpec, params: Mapping[str, Tensor]) -> dict[str, int]:
    """Width of every space of ``spec`` in ``params`` (read from the first use)."""
    out = {}
    for space in spec:
        use = space.uses[0]
        if use.param not in params:
            raise ValueError(f"space {space.name!r} uses missing parameter {use.param!r}")
        size = params[use.param].shape[use.axis]
        if size % (use.outer * use.inner):
            raise ValueError(f"{use.param!r} axis {use.axis} does not fit space {space.name!r}")
        out[space.name] = size // (use.outer * use.inner)
    return out


def naive_embedding(spec: SymmetrySpec, widths: Mapping[str, int]) -> Transform:
    """The embedding that ignores the wide model, for comparison.

    Semi-permutations send wide unit ``i`` to narrow unit ``i mod n`` with uniform
    coefficients; padded permutations and orthogonal maps put the narrow units in the
    first ``n`` wide units (``[I; 0]``); square spaces get the identity.
    """
    elements: dict[str, object] = {}
    for space in spec:
        n, m = space.n, widths.get(space.name, space.n)
        if m < n:
            raise ValueError(f"space {space.name!r}: wide width {m} < narrow width {n}")
        group = space.group
        if isinstance(group, SemiPermutation):
            assign = torch.arange(m) % n
            counts = torch.bincount(assign, minlength=n).float()
            elements[space.name] = SemiPermutationElement(assign, 1.0 / counts[assign], n)
        elif isinstance(group, PaddedPermutation):
            elements[space.name] = PaddedPermutationElement(torch.arange(n), m)
        elif isinstance(group, Orthogonal):
            elements[space.name] = torch.eye(m, n)
        elif m == n:
            elements[space.name] = group.identity(n)
        else:
            raise ValueError(
                f"space {space.name!r} changes width ({n} -> {m}) but its group "
                f"{type(group).__name__} is square"
            )
    return Transform(spec, elements)


def _features(
    spec: SymmetrySpec,
    space: Space,
    params: Mapping[str, Tensor],
    transform: Transform | None,
    units: int,
) -> Tensor:
    """``(units, d)``: every use of the space laid out unit-major and concatenated.

    With ``transform``, the other spaces' elements are applied first (for the narrow
    model, so both models' features have the wide shape along the other axes).
    """
    parts = []
    for use in (u for u in space.uses if u.compare):
        x = params[use.param]
        if transform is not None:
            x = apply_to_param(spec, use.param, x, transform, skip=space.name)
        moved = x.movedim(use.axis % x.ndim, 0).reshape(use.outer, units, -1)
        parts.append(moved.transpose(0, 1).reshape(units, -1).double())
    return torch.cat(parts, dim=1)


def _injective(sim: np.ndarray) -> np.ndarray:
    """Distinct wide row per narrow column maximising the total similarity: ``(n,)``."""
    rows, cols = linear_sum_assignment(sim, maximize=True)
    slots = np.empty(sim.shape[1], dtype=np.int64)
    slots[cols] = rows
    return slots


def _semi_permutation(
    sim: Tensor, cosine: Tensor, coefficients: Coefficients
) -> SemiPermutationElement:
    m, n = sim.shape
    slots = torch.from_numpy(_injective(sim.numpy()))
    assign = cosine.argmax(dim=1)  # leftover wide units: the narrow unit most alike
    assign[slots] = torch.arange(n)
    if coefficients == "uniform":
        raw = torch.ones(m, dtype=torch.float64)
    else:
        raw = cosine[torch.arange(m), assign].clamp_min(0.05)
    totals = torch.zeros(n, dtype=torch.float64).index_add_(0, assign, raw)
    return SemiPermutationElement(assign, (raw / totals[assign]).float(), n)


def _solve_space(group: Group, sim: Tensor, cosine: Tensor, config: WidthMatchingConfig) -> object:
    m, n = sim.shape
    if isinstance(group, SemiPermutation):
        return _semi_permutation(sim, cosine, config.coefficients)
    if isinstance(group, PaddedPermutation):
        return PaddedPermutationElement(torch.from_numpy(_injective(sim.numpy())), m)
    if m != n and not isinstance(group, Orthogonal):
        raise ValueError(
            f"{type(group).__name__} is square but the widths differ ({n} -> {m}); use "
            "SemiPermutation, PaddedPermutation or Orthogonal for this space"
        )
    return solve(group, sim.float())


def _same(group: Group, x: object, y: object) -> bool:
    return bool(torch.equal(group.matrix(x), group.matrix(y)))


def width_matching(
    spec: SymmetrySpec,
    params_wide: Params,
    params_narrow: Params,
    config: WidthMatchingConfig | None = None,
    *,
    init: Transform | None = None,
    seed: int = 0,
    progress: bool = False,
) -> AlignmentResult:
    """Embed ``params_narrow`` into the shape of ``params_wide``, matched to it.

    Coordinate descent over spaces (as weight matching): each space's element is
    solved for the ``(m, n)`` similarity ``C = sum_u A_u B_u^T`` between the wide
    model's units and the narrow model's (other spaces' elements applied), until a
    sweep changes nothing.

    Args:
        spec: the narrow model's spec; spaces that change width need a rectangular
            group (SemiPermutation, PaddedPermutation, Orthogonal).
        params_wide: the reference (wide) model; unchanged.
        params_narrow: the model to embed; unchanged.
        config: sweeps and semi-permutation coefficients.
        init: starting transform (default :func:`naive_embedding`).
        seed: order of spaces in each sweep.
        progress: progress bar over sweeps.

    Returns:
        An :class:`AlignmentResult`: ``apply(spec, params_narrow, result.transform)``
        has the wide model's shapes and the narrow model's function.
    """
    config = config or WidthMatchingConfig()
    spec.validate(params_narrow)
    check_finite(params_wide, what="wide model")
    check_finite(params_narrow, what="narrow model")
    missing = sorted(set(params_narrow) ^ set(params_wide))
    if missing:
        raise ValueError(f"the two models differ in parameter names, e.g. {missing[0]!r}")
    widths = space_widths(spec, params_wide)
    start = time.perf_counter()
    ref = {k: v.detach().double() for k, v in params_wide.items() if v.is_floating_point()}
    other = {k: v.detach().double() for k, v in params_narrow.items() if v.is_floating_point()}
    transform = init or naive_embedding(spec, widths)
    generator = torch.Generator().manual_seed(seed)
    history: list[float] = []
    converged = False
    sweeps = 0
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    bar = tqdm(desc="width matching", unit="sweep", disable=not progress, leave=False)
    try:
        for sweeps in range(1, config.max_iter + 1):
            changed = False
            total = 0.0
            for idx in torch.randperm(len(spec), generator=generator).tolist():
                space = spec.spaces[idx]
                a = _features(spec, space, ref, None, widths[space.name])
                b = _features(spec, space, other, transform, space.n)
                sim = a @ b.T
                cosine = sim / (a.norm(dim=1)[:, None] * b.norm(dim=1)[None, :] + 1e-12)
                element = _solve_space(space.group, sim, cosine, config)
                if sweeps == 1:
                    before[space.name] = _objective(space.group, transform[space.name], sim)
                after[space.name] = _objective(space.group, element, sim)
                total += after[space.name]
                if not _same(space.group, element, transform[space.name]):
                    changed = True
                    transform = transform.replace(**{space.name: element})
            history.append(total)
            bar.update(1)
            if not changed:
                converged = True
                break
    finally:
        bar.close()
    return AlignmentResult(
        transform=transform,
        spaces={k: SpaceDiagnostics(before[k], after[k]) for k in spec.names},
        iterations=sweeps,
        converged=converged,
        seconds=time.perf_counter() - start,
        history=history,
    )


def _objective(group: Group, element: object, sim: Tensor) -> float:
    return float((group.matrix(element) * sim).sum())
