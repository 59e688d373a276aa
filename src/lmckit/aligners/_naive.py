"""The naive baseline: no alignment at all (the identity transform)."""

from __future__ import annotations

import torch
from torch import nn

from lmckit.aligners._registry import register_aligner
from lmckit.aligners._result import AlignmentResult
from lmckit.data import Dataset
from lmckit.symmetry._params import Params, check_compatible
from lmckit.symmetry._transform import SymmetrySpec, Transform

__all__ = ["naive"]


@register_aligner(
    "naive",
    paper="Frankle, Dziugaite, Roy, Carbin, 2020, Linear Mode Connectivity and the "
    "Lottery Ticket Hypothesis, https://arxiv.org/abs/1912.05671",
)
def naive(
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    config: None = None,
    *,
    model: nn.Module | None = None,
    data: Dataset | None = None,
    seed: int = 0,
    progress: bool = False,
    device: str | torch.device | None = None,
) -> AlignmentResult:
    """No alignment: the identity transform, the baseline every method is measured
    against (the path from A to B as trained). Checks that the models fit ``spec``."""
    check_compatible(params_a, params_b)
    spec.validate(params_b)
    return AlignmentResult(transform=Transform.identity(spec), iterations=0)
