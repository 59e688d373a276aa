"""Width-heterogeneous alignment: embed a narrow model into a wide one, then match.

A narrow model (``n`` units in a space) is embedded into a wide one (``m >= n``
units) by a rectangular group element ``T`` (``m x n``) that leaves its function
unchanged, chosen so the embedded model is close to the wide model:

- :class:`~lmckit.groups.SemiPermutation` for positively homogeneous units (ReLU):
  every wide unit copies one narrow unit, the writer row scaled by ``c_i > 0`` with
  ``sum_{i -> j} c_i = 1``; ``relu(c x) = c relu(x)`` makes the split exact. Chosen by
  a rectangular assignment (each narrow unit gets one wide unit), then every leftover
  wide unit joins the narrow unit it resembles most (cosine of weights).
- :class:`~lmckit.groups.PaddedPermutation` for any unit type (GELU FFN neurons,
  ...): the narrow units go to ``n`` distinct wide slots, the other ``m - n`` wide
  units get zero writers and readers, so they output ``act(0) * 0 = 0``. Chosen by
  rectangular assignment.
- :class:`~lmckit.groups.Orthogonal` with ``m > n`` for linear spaces (residual
  streams of RMSNorm transformers): orthonormal columns, ``O^T O = I``; solved by
  Procrustes on the ``m x n`` similarity (``U V^T``).
- Square groups where widths agree are solved as in weight matching.

:func:`width_matching` is weight matching (:mod:`lmckit.aligners._weight`, which solves
every group, rectangular ones included) started from :func:`naive_embedding`. The
spec passed in is the *narrow* model's spec with these groups (``spec.with_groups``);
``apply(spec, narrow_params, result.transform)`` gives params of the wide shape, to be
run through the wide model's module (e.g. from ``lmckit.models.create_model`` with the
wide configuration).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from lmckit.aligners._registry import register_aligner
from lmckit.aligners._result import AlignmentResult
from lmckit.aligners._weight import WeightMatchingConfig, space_widths, weight_matching
from lmckit.data import Dataset
from lmckit.groups import PaddedPermutation
from lmckit.groups._padded_permutation import PaddedPermutationElement
from lmckit.groups._semi_permutation import Coefficients
from lmckit.symmetry._params import Params, check_finite
from lmckit.symmetry._transform import SymmetrySpec, Transform

__all__ = [
    "GENERALIZED_LMC",
    "PaddedPermutation",
    "PaddedPermutationElement",
    "WidthMatchingConfig",
    "naive_embedding",
    "space_widths",
    "width_matching",
]

GENERALIZED_LMC = (
    "Theus, Cabodi, Anagnostidis, Orvieto, Singh, Boeva, 2025, Generalized Linear Mode "
    "Connectivity for Transformers, https://arxiv.org/abs/2506.22712"
)


@dataclass(frozen=True)
class WidthMatchingConfig:
    """What to compute.

    Attributes:
        max_iter: maximum sweeps over all spaces; a sweep that changes no element stops.
        coefficients: semi-permutation split coefficients: ``uniform`` (``1 / k`` for a
            narrow unit split into ``k`` wide units) or ``similarity`` (proportional to
            each wide unit's cosine similarity with its narrow unit, clipped at 0.05);
            set on every group that has the option (``SemiPermutation(coefficients=)``).
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


def naive_embedding(spec: SymmetrySpec, widths: Mapping[str, int]) -> Transform:
    """The embedding that ignores the wide model, for comparison.

    Each space gets its group's plain embedding (:meth:`lmckit.groups.Group.embedding`):
    semi-permutations send wide unit ``i`` to narrow unit ``i mod n`` with uniform
    coefficients; padded permutations and orthogonal maps put the narrow units in the
    first ``n`` wide units (``[I; 0]``); square spaces get the identity.
    """
    elements: dict[str, object] = {}
    for space in spec:
        n, m = space.n, widths.get(space.name, space.n)
        if m < n:
            raise ValueError(f"space {space.name!r}: wide width {m} < narrow width {n}")
        if m != n and not space.group.rectangular:
            raise ValueError(
                f"space {space.name!r} changes width ({n} -> {m}) but its group "
                f"{space.group.name} is square; use SemiPermutation, PaddedPermutation "
                "or Orthogonal for this space"
            )
        elements[space.name] = space.group.embedding(n, m)
    return Transform(spec, elements)


@register_aligner("width_matching", paper=GENERALIZED_LMC, config=WidthMatchingConfig)
def width_matching(
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    config: WidthMatchingConfig | None = None,
    *,
    model: nn.Module | None = None,
    data: Dataset | None = None,
    seed: int = 0,
    progress: bool = False,
    device: str | torch.device | None = None,
    init: Transform | None = None,
) -> AlignmentResult:
    """Width matching: embed a narrow model into a wide one's shape, matched to it.

    Weight matching from :func:`naive_embedding`: each space's element is solved for
    the ``(m, n)`` similarity between the wide model's units and the narrow model's
    (other spaces' elements applied), until a sweep changes nothing.

    Args:
        spec: the narrow model's spec; spaces that change width need a rectangular
            group (SemiPermutation, PaddedPermutation, Orthogonal).
        params_a: the reference (wide) model; unchanged.
        params_b: the (narrow) model to embed; unchanged.
        config: sweeps and semi-permutation coefficients.
        model, data: unused (data-free); accepted for the common aligner signature.
        seed: order of spaces in each sweep.
        progress: progress bar over sweeps.
        device: where the similarities are computed (default CPU).
        init: starting transform (default :func:`naive_embedding`).

    Returns:
        An :class:`AlignmentResult`: ``result.apply(params_b)`` has the wide
        model's shapes and the narrow model's function.
    """
    config = config or WidthMatchingConfig()
    spec.validate(params_b)
    check_finite(params_a, what="wide model")
    check_finite(params_b, what="narrow model")
    missing = sorted(set(params_b) ^ set(params_a))
    if missing:
        raise ValueError(f"the two models differ in parameter names, e.g. {missing[0]!r}")
    start = init or naive_embedding(spec, space_widths(spec, params_a))
    groups = {s.name: s.group.with_options(coefficients=config.coefficients) for s in spec}
    tuned = spec.with_groups(**groups)
    result = weight_matching(
        tuned,
        params_a,
        params_b,
        WeightMatchingConfig(max_iter=config.max_iter),
        seed=seed,
        progress=progress,
        device=device,
        init=Transform(tuned, dict(start.elements)),
    )
    # the transform belongs to the caller's spec (same spaces, the groups as given)
    return AlignmentResult(
        transform=Transform(spec, dict(result.transform.elements)),
        spaces=result.spaces,
        iterations=result.iterations,
        converged=result.converged,
        seconds=result.seconds,
        history=result.history,
    )
