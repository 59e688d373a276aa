"""A merged point: the model ``(1 - t) A + t B``, with BatchNorm reset or REPAIR."""

from __future__ import annotations

from torch import nn

from lmckit.data import Dataset
from lmckit.datafit import check_data_fits
from lmckit.measure import MERGE_METHOD_OF_FIX, EvalSettings, train_inputs
from lmckit.merge import has_batchnorm
from lmckit.merge_methods import merge, merge_info
from lmckit.params import Params

__all__ = ["MERGE_FIXES", "merge_pair"]

#: What :func:`merge_pair` does after interpolating.
MERGE_FIXES = tuple(MERGE_METHOD_OF_FIX)


def merge_pair(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    *,
    t: float = 0.5,
    fix: str = "none",
    data: Dataset | None = None,
    settings: EvalSettings | None = None,
) -> Params:
    """The point ``(1 - t) a + t b``, optionally with BatchNorm reset or REPAIR on ``data``.

    Raises:
        ValueError: ``t`` outside ``[0, 1]``, an unknown fix, a fix without data, or
            ``reset_bn`` for a network without BatchNorm.
    """
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"--t must lie in [0, 1], got {t}")
    if fix not in MERGE_FIXES:
        raise ValueError(f"fix must be one of {', '.join(MERGE_FIXES)}, got {fix!r}")
    info = merge_info(MERGE_METHOD_OF_FIX[fix])
    if info.needs_data and data is None:
        raise ValueError(f"{fix} needs data (--data)")
    if fix == "reset_bn" and not has_batchnorm(model):
        raise ValueError("--reset-bn: the model has no BatchNorm layers")
    if data is not None:
        check_data_fits(model, data)
    inputs = train_inputs(data, settings or EvalSettings()) if data is not None else None
    return merge(info.name, params_a, params_b, t, model=model, inputs=inputs)
