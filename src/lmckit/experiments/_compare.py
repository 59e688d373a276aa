"""Alignment methods compared on one pair: each registered aligner run, then its path measured.

What the demo and the experiments tabulate (naive, weight and activation matching side by
side); a user aligning two models calls :func:`lmckit.align` or
:func:`lmckit.plan.plan_alignment` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from lmckit.aligners._registry import aligner_info
from lmckit.aligners._result import AlignmentResult
from lmckit.aligners._run import AlignRun
from lmckit.data import Dataset
from lmckit.measure._evaluate import PathResult
from lmckit.measure._measure import EvalSettings, measure_path
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import SymmetrySpec, apply

__all__ = ["METHODS", "align_pair", "compare_alignments"]

#: Methods of :func:`align_pair` / :func:`compare_alignments`.
METHODS = ("naive", "weight_matching", "activation_matching")


def _stream_config(info: Any, data: Dataset | None, settings: EvalSettings) -> Any:
    """The config of an aligner that streams training batches (``batch_size`` and
    ``batches`` fields, e.g. activation matching), sized by ``settings``; else ``None``."""
    fields = getattr(info.config, "__dataclass_fields__", {})
    if data is None or not {"batch_size", "batches"} <= set(fields):
        return None
    return info.config(batch_size=settings.batch_for(data), batches=settings.stat_batches)


def align_pair(
    method: str,
    model: nn.Module,
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    data: Dataset | None,
    settings: EvalSettings | None = None,
    *,
    seed: int = 0,
    progress: bool = False,
) -> AlignmentResult | None:
    """Run the registered aligner ``method`` (:mod:`lmckit.aligners._registry`) on one pair.

    ``naive`` returns ``None`` (no transform). Aligners that stream training batches
    take the settings' evaluation batch size and ``stat_batches``.

    Raises:
        ValueError: an unknown method (listing the valid ones) or missing data.
    """
    settings = settings or EvalSettings()
    if method == "naive":
        return None
    try:
        info = aligner_info(method)
    except KeyError as err:
        raise ValueError(f"{err.args[0]}") from None
    config = _stream_config(info, data, settings)
    return info.run(spec, params_a, params_b, config, AlignRun(model, data, seed, progress))


def compare_alignments(
    model: nn.Module,
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    methods: Sequence[str] = METHODS,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, PathResult]:
    """Path results between A and B aligned to A by each method, keyed by method."""
    settings = settings or EvalSettings()
    out = {}
    for method in methods:
        result = align_pair(
            method, model, spec, params_a, params_b, data, settings, seed=seed, progress=progress
        )
        b = params_b if result is None else apply(spec, params_b, result.transform)
        meta: dict[str, Any] = {"method": method}
        if result is not None:
            meta["align_seconds"] = round(result.seconds, 4)
            meta["align_sweeps"] = result.iterations
        out[method] = measure_path(model, params_a, b, data, settings, meta=meta, progress=progress)
    return out
