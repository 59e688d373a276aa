"""The multi-model barrier over the simplex spanned by K models (:func:`simplex_barrier`),
unaligned or with every model moved into one frame by universe matching."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from torch import nn

from lmckit._errors import Param, ParameterError
from lmckit.data import Dataset, batches
from lmckit.data._fit import check_data_fits
from lmckit.formats._io import LoadedModel
from lmckit.forms._choice import check_heads_request
from lmckit.forms._recipe import aligned_form, spec_of
from lmckit.measure._measure import MERGE_METHOD_OF_FIX, EvalSettings, resolve_fix, train_inputs
from lmckit.merging._methods import path_prepare
from lmckit.paths._simplex import SimplexResult, check_simplex_size, evaluate_simplex
from lmckit.symmetry._params import Params

__all__ = ["check_simplex_request", "simplex_barrier"]


def _at_simplex_point(
    on_path: Callable[[Params, float], Params], theta: Params, _weights: tuple[float, ...]
) -> Params:
    # NaN for t: a path hook that did read t would show it in the results
    return on_path(theta, math.nan)


def check_simplex_request(
    models: int,
    *,
    align: str = "none",
    head_bases: bool = False,
    circuits: bool = False,
    fix: str = "auto",
) -> None:
    """Refuse options :func:`simplex_barrier` cannot take together; cheap, so callers
    check before loading anything.

    Raises:
        ParameterError: fewer than two models, an unknown ``align``, ``head_bases``
            without ``align="weight"`` or with ``circuits``, or ``fix="repair"``.
    """
    if models < 2:
        raise ParameterError(f"a simplex needs at least two {{checkpoints}}, got {models}",
                             checkpoints="checkpoints")  # fmt: skip
    if align not in ("none", "weight"):
        raise ParameterError(f"{{align}} must be none or weight, got {align!r}", align="align")
    if head_bases and align != "weight":
        raise ParameterError("{head_bases} goes with {align}", align=Param("align", "weight"),
                             head_bases=Param("head_bases", True))  # fmt: skip
    check_heads_request(circuits, head_bases)
    if fix == "repair":
        raise ParameterError("{fix} is for two models; use reset_bn or none with a simplex",
                             fix=Param("fix", "repair"))  # fmt: skip


def simplex_barrier(
    checkpoints: Sequence[LoadedModel],
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    resolution: int = 12,
    align: str = "none",
    head_bases: bool = False,
    circuits: bool = False,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
    progress: bool = False,
) -> SimplexResult:
    """The multi-model barrier over the simplex spanned by ``checkpoints``.

    Args:
        checkpoints: ``K >= 2`` checkpoints of one architecture.
        data: evaluation data (the settings' split).
        settings: split, fix (``auto``, ``none`` or ``reset_bn``) and batch size.
        resolution: grid step ``1 / resolution`` in each convex weight; the grid's size
            is checked before anything is allocated.
        align: ``none``, or ``weight``: universe matching of every model into one frame.
        head_bases: with ``align="weight"``, align every model's head bases to the first.
        circuits: interpolate transformers with heads as QK/OV circuits.
        seed, meta, progress: alignment seed, extra metadata, progress bars.
    """
    settings = settings or EvalSettings()
    check_simplex_request(len(checkpoints), align=align, head_bases=head_bases,
                          circuits=circuits, fix=settings.fix)  # fmt: skip
    check_simplex_size(len(checkpoints), resolution)
    model = checkpoints[0].module
    models = [c.params for c in checkpoints]
    if circuits:
        forms = [aligned_form(model, m, m, circuits=True) for m in models]
        model, models = forms[0].module, [dict(f.a) for f in forms]
    check_data_fits(model, data)
    fix = resolve_fix(model, settings.fix)
    info: dict[str, Any] = {**(meta or {}), "align": align, "circuits": circuits}
    if align == "weight":
        models = _universe_aligned(model, models, info, head_bases=head_bases, seed=seed,
                                   progress=progress)  # fmt: skip
    # the same fix as on a path (checked as there); the fixes allowed here do not read
    # where on the path a point lies, and a simplex point has convex weights, not a t
    on_path = path_prepare(
        MERGE_METHOD_OF_FIX[fix], model, models[0], models[1], train_inputs(data, settings)
    )
    prepare = None if on_path is None else partial(_at_simplex_point, on_path)
    x, y = data.split(settings.split)
    info.update(split=settings.split, fix=fix, resolution=resolution)
    size = settings.batch_for(data)
    return evaluate_simplex(
        model,
        models,
        lambda: batches(x, y, size),
        resolution=resolution,
        prepare=prepare,
        meta=info,
        progress=progress,
    )


def _universe_aligned(
    model: nn.Module,
    models: list[Params],
    info: dict[str, Any],
    *,
    head_bases: bool,
    seed: int,
    progress: bool,
) -> list[Params]:
    """``models`` moved into one frame by universe matching (with ``head_bases``, each
    model's head bases then aligned to the first's); what it took recorded in ``info``."""
    from lmckit.aligners import head_bases_matching, universe_matching

    spec = spec_of(model)
    universe = universe_matching(
        spec, models[0], models[1], others=models[2:], seed=seed, progress=progress
    )
    models = universe.aligned(spec, models)
    info.update(align_sweeps=universe.iterations, align_seconds=round(universe.seconds, 4))
    if head_bases:
        first = models[0]
        models = [first] + [head_bases_matching(spec, first, p).apply(p) for p in models[1:]]
        info["head_bases"] = True
    return models
