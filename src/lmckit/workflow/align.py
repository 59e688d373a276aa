"""Align a pair: one registered aligner on one pair, every method compared, and the
whole recipe (form, method, head bases) on two loaded models."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lmckit.aligners.registry import AlignerInfo, aligner_info
from lmckit.aligners.result import AlignmentResult
from lmckit.aligners.weight.start_choice import StartChoice
from lmckit.data import Dataset
from lmckit.datafit import check_data_fits
from lmckit.evaluate import PathResult
from lmckit.hf import ZOO_CONVERSIONS, HFModel, zoo_from_hf
from lmckit.io import LoadedModel, model_format
from lmckit.measure import EvalSettings, measure_path
from lmckit.outputs import OutputKind
from lmckit.params import Params
from lmckit.recipe import AlignForm, aligned_form, check_symmetry
from lmckit.spec.inputs import ExampleInputs
from lmckit.symmetry import SymmetrySpec, apply

__all__ = [
    "ALIGN_METHODS",
    "METHODS",
    "AlignedPair",
    "align_models",
    "align_output_kind",
    "align_pair",
    "check_align_request",
    "compare_alignments",
    "pair_form",
]

#: Methods of :func:`align_pair` / :func:`compare_alignments`.
METHODS = ("naive", "weight_matching", "activation_matching")
#: Short names of :func:`align_models`' methods and their full names.
ALIGN_METHODS = {
    "weight": "weight_matching",
    "activation": "activation_matching",
    "learned": "learned_matching",
}


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
    """Run the registered aligner ``method`` (:mod:`lmckit.aligners.registry`) on one pair.

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


def pair_form(
    a: LoadedModel,
    b: LoadedModel,
    symmetry: str | None,
    circuits: bool,
    example_inputs: ExampleInputs | None = None,
) -> AlignForm:
    """The pair's alignment form; a LayerNorm Hugging Face GPT-2 or ViT folder under
    ``symmetry="orthogonal"`` is converted to lmckit's zoo model first (the rotation
    needs the RMSNorm form, which its own class cannot hold)."""
    try:
        return aligned_form(
            a.module,
            a.params,
            b.params,
            symmetry=symmetry,
            circuits=circuits,
            example_inputs=example_inputs,
        )
    except ValueError as err:
        source = a.source
        convertible = (
            isinstance(source, HFModel)
            and source.config.get("model_type") in ZOO_CONVERSIONS
            and a.path is not None
            and b.path is not None
        )
        if symmetry != "orthogonal" or "LayerNorm" not in str(err) or not convertible:
            raise
    assert a.path is not None and b.path is not None
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
    example_inputs: ExampleInputs | None = None,
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
        config: the method's config (:attr:`lmckit.aligners.registry.AlignerInfo.config`,
            e.g. a :class:`lmckit.aligners.LearnedMatchingConfig`); ``None``: its defaults.
        device: where the method runs its tensor work (results come back on the CPU).
        progress: progress bars.
        example_inputs: inputs to trace the architecture with (see
            :func:`lmckit.recipe.aligned_form`); default: a zoo model's or a Hugging Face
            model's own.

    Raises:
        ValueError: a user mistake (unknown method, missing data, incompatible options, a
            symmetry the architecture cannot have).
    """
    from lmckit.aligners import head_bases_matching

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
    form = pair_form(a, b, symmetry, circuits, example_inputs)
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
    if isinstance(result, StartChoice):
        metadata["start"] = {"chosen": result.start, "midpoint_losses": result.midpoint_losses}
    if method == "learned" and config is not None:
        metadata["learned"] = {
            "steps": config.steps,
            "lr": config.lr,
            "validation_midpoint": result.history,
        }
    same = form.module is a.module
    reference = pa if (form.rewritten or form.folded or not same) else None
    return AlignedPair(form.module, aligned, reference, result, form.form, same, metadata)


def check_align_request(
    method: str,
    *,
    symmetry: str | None = None,
    circuits: bool = False,
    head_bases: bool = False,
    has_data: bool = False,
) -> AlignerInfo:
    """The registry entry of :func:`align_models`' ``method``, after refusing options
    that cannot go together; cheap, so callers check before loading anything.

    Raises:
        ValueError: an unknown method or symmetry, ``circuits`` with ``head_bases``, or
            a method that needs data without it.
    """
    if method not in ALIGN_METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(ALIGN_METHODS)}")
    check_symmetry(symmetry)
    if circuits and head_bases:
        raise ValueError("--head-bases aligns bases inside heads; --circuits leaves none")
    info = aligner_info(ALIGN_METHODS[method])
    if info.needs_data and not has_data:
        raise ValueError(f"{info.name} needs data (--data)")
    return info
