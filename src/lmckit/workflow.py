"""Whole tasks, one call each: train, align a pair, merge, compare methods, a simplex.

Each function takes loaded models and data and returns results; none reads or writes
files. The command line is a thin layer over them (parse, validate, call one of these,
write), and the experiments and library users get the same behaviour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lmckit.align.registry import aligner_info
from lmckit.align.result import AlignmentResult
from lmckit.data import Dataset, batches
from lmckit.datafit import check_data_fits
from lmckit.evaluate import Metrics, PathResult
from lmckit.hf import ZOO_CONVERSIONS, HFModel, zoo_from_hf
from lmckit.io import LoadedModel, model_format
from lmckit.measure import (
    MERGE_METHOD_OF_FIX,
    EvalSettings,
    evaluate_split,
    measure_path,
    resolve_fix,
    train_inputs,
)
from lmckit.merge import has_batchnorm
from lmckit.merge_methods import merge, merge_info, path_prepare
from lmckit.models import ModelConfig, ZooModel, create_model
from lmckit.models.sizing import check_fits_in_memory
from lmckit.outputs import OutputKind
from lmckit.params import Params
from lmckit.paths.simplex import SimplexResult, check_simplex_size, evaluate_simplex
from lmckit.recipe import AlignForm, aligned_form, spec_of
from lmckit.symmetry import SymmetrySpec, apply
from lmckit.train import TrainConfig, TrainResult, fit

__all__ = [
    "ALIGN_METHODS",
    "METHODS",
    "MERGE_FIXES",
    "AlignedPair",
    "TrainedModel",
    "align_models",
    "align_output_kind",
    "align_pair",
    "compare_alignments",
    "merge_pair",
    "pair_barrier",
    "simplex_barrier",
    "train_model",
]

#: Methods of :func:`align_pair` / :func:`compare_alignments`.
METHODS = ("naive", "weight_matching", "activation_matching")
#: Short names of :func:`align_models`' methods and their full names.
ALIGN_METHODS = {
    "weight": "weight_matching",
    "activation": "activation_matching",
    "learned": "learned_matching",
}
#: What :func:`merge_pair` does after interpolating.
MERGE_FIXES = ("none", "reset_bn", "repair")


# --------------------------------------------------------------------------- train


@dataclass(frozen=True)
class TrainedModel:
    """What :func:`train_model` returns: the module, its training record, test metrics."""

    model: ZooModel
    result: TrainResult
    test: Metrics


def train_model(
    config: ModelConfig,
    data: Dataset,
    train: TrainConfig,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    eval_batch_size: int | None = None,
    progress: bool = False,
) -> TrainedModel:
    """Build ``config`` from ``seed``, train it on ``data``, measure it on the test split.

    The memory the model needs (weights, gradients and two optimiser moments) is
    checked against the machine's before anything is built, and the data against the
    model before any step.

    Raises:
        ValueError: a model that does not fit memory or the data, or a bad setting.
    """
    check_fits_in_memory(config, copies=4)
    module, params = create_model(config.name, seed=seed, **config.kwargs)
    check_data_fits(module, data)
    result = fit(module, params, data, train, seed=seed, device=device, progress=progress)
    test = evaluate_split(module, result.params, data, batch_size=eval_batch_size)
    return TrainedModel(module, result, test)


# --------------------------------------------------------------------------- align


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
    """Run the registered aligner ``method`` (:mod:`lmckit.align.registry`) on one pair.

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
    if info.needs_data and data is None:
        raise ValueError(f"{method.replace('_', ' ')} needs data")
    config = _stream_config(info, data, settings)
    return info.fn(
        spec, params_a, params_b, config, model=model, data=data, seed=seed, progress=progress
    )


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


@dataclass(frozen=True)
class AlignedPair:
    """What :func:`align_models` returns.

    Attributes:
        module: the architecture of the aligned B (its form: folded norm scales,
            RMSNorm, circuits, ...).
        params: B aligned to A, in that form.
        reference: A in the same form when that differs from A as given (measure
            barriers against it), else ``None``.
        result: the aligner's result (transform, per-space diagnostics).
        form: description of the form, empty when nothing was done.
        same_architecture: ``module`` is the given models' architecture (the result is
            written in their format); ``False`` after a rewrite to a new zoo
            configuration (written as an lmckit checkpoint).
        metadata: method, options and diagnostics, JSON-ready.
    """

    module: nn.Module
    params: Params
    reference: Params | None
    result: AlignmentResult
    form: str
    same_architecture: bool
    metadata: dict[str, Any] = field(default_factory=dict)


def _form(a: LoadedModel, b: LoadedModel, symmetry: str | None, circuits: bool) -> AlignForm:
    """The pair's alignment form; a LayerNorm Hugging Face GPT-2 or ViT under
    ``symmetry="orthogonal"`` is converted to lmckit's zoo model first (the rotation
    needs the RMSNorm form, which its own class cannot hold)."""
    try:
        return aligned_form(a.module, a.params, b.params, symmetry=symmetry, circuits=circuits)
    except ValueError as err:
        source = a.source
        convertible = (
            isinstance(source, HFModel) and source.config.get("model_type") in ZOO_CONVERSIONS
        )
        if symmetry != "orthogonal" or "LayerNorm" not in str(err) or not convertible:
            raise
    (module, pa), (_, pb) = zoo_from_hf(a.path), zoo_from_hf(b.path)
    return aligned_form(module, pa, pb, symmetry=symmetry, circuits=circuits)


def align_output_kind(path_b: str, symmetry: str | None) -> OutputKind:
    """What :func:`align_models` will write for B at ``path_b`` (checked before loading):
    a Hugging Face folder stays one, except a LayerNorm GPT-2 or ViT aligned with
    rotations, which becomes lmckit's RMSNorm form (a checkpoint)."""
    if model_format(path_b) != "hf":
        return "checkpoint"
    from lmckit.hf.files import read_hf_config

    if symmetry == "orthogonal" and read_hf_config(path_b).get("model_type") in ZOO_CONVERSIONS:
        return "checkpoint"
    return "hf"


def align_models(
    a: LoadedModel,
    b: LoadedModel,
    *,
    method: str = "weight",
    symmetry: str | None = None,
    circuits: bool = False,
    head_bases: bool = False,
    data: Dataset | None = None,
    seed: int = 0,
    config: Any = None,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> AlignedPair:
    """Align model ``b`` to ``a``: prepare the pair's form, run the method, move B.

    Args:
        a, b: two models of one architecture (lmckit checkpoints or Hugging Face folders,
            :func:`lmckit.load_model`).
        method: ``weight`` (data-free), ``activation`` or ``learned`` (need ``data``).
        symmetry, circuits: the form (see :func:`lmckit.recipe.aligned_form`).
        head_bases: afterwards align the bases inside matched attention heads.
        data: training data for activation statistics or learned matching; checked to
            fit the model whenever given.
        seed: the method's randomness.
        config: the method's config (:attr:`lmckit.align.registry.AlignerInfo.config`,
            e.g. a :class:`lmckit.align.LearnedMatchingConfig`); ``None``: its defaults.
        device: where the method runs its tensor work (results come back on the CPU).
        progress: progress bars.

    Raises:
        ValueError: a user mistake (unknown method, missing data, incompatible options, a
            symmetry the architecture cannot have).
    """
    from lmckit.align import head_bases_matching

    if method not in ALIGN_METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(ALIGN_METHODS)}")
    if circuits and head_bases:
        raise ValueError("--head-bases aligns bases inside heads; --circuits leaves none")
    full = ALIGN_METHODS[method]
    info = aligner_info(full)
    if info.needs_data and data is None:
        raise ValueError(f"{full} needs data (--data)")
    if data is not None:
        check_data_fits(a.module, data)
    form = _form(a, b, symmetry, circuits)
    spec, pa, pb = form.spec, form.a, form.b
    result = info.fn(spec, pa, pb, config, model=form.module, data=data, seed=seed,
                     progress=progress, device=device)  # fmt: skip
    aligned = apply(spec, pb, result.transform)
    if head_bases:
        aligned = head_bases_matching(spec, pa, aligned).apply(aligned)
    metadata: dict[str, Any] = {
        "method": full,
        "symmetry": symmetry,
        "seed": seed,
        "head_bases": head_bases,
        "circuits": circuits,
        "form": form.form,
        "folded_norm_scales": sorted(form.folded),
        "spaces": {k: vars(v) for k, v in result.spaces.items()},
    }
    if method == "learned" and config is not None:
        metadata["learned"] = {
            "steps": config.steps,
            "lr": config.lr,
            "validation_midpoint": result.history,
        }
    same = form.module is a.module
    reference = pa if (form.rewritten or form.folded or not same) else None
    return AlignedPair(form.module, aligned, reference, result, form.form, same, metadata)


# --------------------------------------------------------------------------- merge


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


# --------------------------------------------------------------------------- barriers


def pair_barrier(
    a: LoadedModel,
    b: LoadedModel,
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    circuits: bool = False,
    meta: dict[str, Any] | None = None,
    progress: bool = False,
) -> PathResult:
    """Loss and accuracy along the linear path from ``a`` to ``b`` on ``data``.

    With ``circuits`` lmckit's transformers are interpolated with heads as QK/OV
    circuits (the ends are the same functions; the path between them differs).
    """
    module, pa, pb = a.module, a.params, b.params
    if circuits:
        form = aligned_form(module, pa, pb, circuits=True)
        module, pa, pb = form.module, form.a, form.b
    check_data_fits(module, data)
    return measure_path(module, pa, pb, data, settings, meta=meta, progress=progress)


def simplex_barrier(
    checkpoints: Sequence[LoadedModel],
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    resolution: int = 10,
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
    from lmckit.align import head_bases_matching, universe_matching

    settings = settings or EvalSettings()
    if len(checkpoints) < 2:
        raise ValueError("--simplex needs at least two models")
    if align not in ("none", "weight"):
        raise ValueError(f"align must be none or weight, got {align!r}")
    if head_bases and align != "weight":
        raise ValueError("--head-bases goes with --simplex --align weight")
    if head_bases and circuits:
        raise ValueError("--head-bases aligns bases inside heads; --circuits leaves none")
    if settings.fix == "repair":
        raise ValueError("--fix repair is for two models; use reset_bn or none with --simplex")
    check_simplex_size(len(checkpoints), resolution)
    model = checkpoints[0].module
    models = [c.params for c in checkpoints]
    if circuits:
        forms = [aligned_form(model, m, m, circuits=True) for m in models]
        model, models = forms[0].module, [f.a for f in forms]
    check_data_fits(model, data)
    fix = resolve_fix(model, settings.fix)
    info: dict[str, Any] = {**(meta or {}), "align": align, "circuits": circuits}
    if align == "weight":
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
    # the same fix as on a path; at a simplex point it is handed the weights, not t
    prepare = path_prepare(
        MERGE_METHOD_OF_FIX[fix], model, models[0], models[1], train_inputs(data, settings)
    )
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
