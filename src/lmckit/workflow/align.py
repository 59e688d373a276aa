"""Align a pair: the whole recipe (form, method, head bases) on two loaded models."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.aligners.registry import AlignerInfo, aligner_info
from lmckit.aligners.result import AlignmentResult
from lmckit.aligners.run import AlignRun
from lmckit.aligners.weight.start_choice import midpoint_loss
from lmckit.data import Dataset
from lmckit.data.token_stats import token_row_masks
from lmckit.datafit import check_data_fits
from lmckit.distributed import computed_once
from lmckit.forms import FORMS, FormChoice, choose_form, possible_forms
from lmckit.hf import ZOO_CONVERSIONS, HFModel, zoo_from_hf
from lmckit.io import LoadedModel
from lmckit.outputs import OutputKind
from lmckit.recipe import AlignForm, aligned_form, check_symmetry, written_alike
from lmckit.spec.inputs import ExampleInputs
from lmckit.symmetry import MovedParams, SymmetrySpec, apply
from lmckit.workflow.b_function import (
    B_RTOL,
    BFunctionError,
    check_b_function,
    outputs_changed,
)

__all__ = [
    "ALIGN_METHODS",
    "AlignedPair",
    "align_models",
    "align_output_kind",
    "check_align_request",
    "choose_pair_form",
    "convertible",
    "model_in_form",
    "pair_form",
]

#: Short names of :func:`align_models`' methods and their full names.
ALIGN_METHODS = {
    "weight": "weight_matching",
    "activation": "activation_matching",
    "learned": "learned_matching",
}


@dataclass(frozen=True)
class AlignedPair:
    """What :func:`align_models` returns.

    Attributes:
        module: the architecture of the aligned B (its form: folded norm scales,
            RMSNorm, circuits, ...).
        params: B aligned to A, in that form, each tensor in B's stored dtype and
            computed when read (:class:`~lmckit.symmetry.MovedParams`; a plain dict
            after ``head_bases``).
        reference: A in the same form when that differs from A as given (measure
            barriers against it), else ``None``; folded norm scales are computed when
            read (:class:`~lmckit.spec.fold.FoldedParams`).
        result: the aligner's result (transform, per-space diagnostics).
        form: description of the form, empty when nothing was done.
        same_architecture: ``module`` is the given models' architecture (the result is
            written in their format); ``False`` after a rewrite to a new zoo
            configuration (written as an lmckit checkpoint).
        metadata: method, options and diagnostics, JSON-ready.
        choice: the form chosen (:func:`lmckit.forms.choose_form`), also in
            ``metadata["form_choice"]``: what :func:`~lmckit.workflow.pair_barrier` reads.
        left_out: one line per space whose element changed B's outputs and was reset to
            the identity (:func:`lmckit.workflow.b_function.check_b_function`), also in
            ``metadata["b_function"]``.
    """

    module: nn.Module
    params: Mapping[str, Tensor]
    reference: Mapping[str, Tensor] | None
    result: AlignmentResult
    form: str
    same_architecture: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    choice: FormChoice | None = None
    left_out: tuple[str, ...] = ()


def convertible(model: LoadedModel) -> bool:
    """Whether ``model`` is a Hugging Face folder lmckit converts into one of its own
    models (:data:`lmckit.hf.ZOO_CONVERSIONS`), whose rewrites (RMSNorm, circuits) it has."""
    source = model.source
    # the conversion reads the folder: a module held in memory is not convertible
    return (
        model.path is not None
        and isinstance(source, HFModel)
        and source.config.get("model_type") in ZOO_CONVERSIONS
    )


def choose_pair_form(
    a: LoadedModel,
    *,
    method: str = "weight",
    symmetry: str | None = None,
    circuits: bool | None = None,
    head_bases: bool = False,
) -> FormChoice:
    """:func:`lmckit.forms.choose_form` for a loaded model (Hugging Face GPT-2 and ViT
    folders may take the zoo's forms)."""
    return choose_form(a.module, method=method, symmetry=symmetry, circuits=circuits,
                       head_bases=head_bases, convertible=convertible(a))  # fmt: skip


def pair_form(
    a: LoadedModel,
    b: LoadedModel,
    choice: FormChoice,
    example_inputs: ExampleInputs | None = None,
    spec: SymmetrySpec | None = None,
) -> AlignForm:
    """The pair in the form ``choice`` names (converted to lmckit's own model first when
    the form needs its rewrites; ``example_inputs`` trace the model otherwise; ``spec``:
    A's module's own spec if already inferred)."""
    if choice.to_zoo and convertible(a):
        assert a.path is not None and b.path is not None
        (module, pa), (_, pb) = zoo_from_hf(a.path), zoo_from_hf(b.path)
        return aligned_form(module, pa, pb, symmetry=choice.symmetry, circuits=choice.circuits,
                            rms=FORMS[choice.name].rms)  # fmt: skip
    return aligned_form(a.module, a.params, b.params, symmetry=choice.symmetry,
                        circuits=choice.circuits, example_inputs=example_inputs,
                        rms=FORMS[choice.name].rms, spec=spec)  # fmt: skip


def model_in_form(model: LoadedModel, choice: FormChoice) -> AlignForm:
    """One model in the form ``choice`` names (as :func:`pair_form` puts it)."""
    return pair_form(model, model, choice)


def align_output_kind(b: LoadedModel, choice: FormChoice) -> OutputKind:
    """What :func:`align_models` writes for B in the form ``choice``: a Hugging Face
    folder stays one unless the form needs lmckit's own model (then a checkpoint)."""
    return "hf" if b.format == "hf" and not choice.to_zoo else "checkpoint"


def _row_masks(form: AlignForm, data: Dataset | None) -> dict[str, Tensor]:
    """Unseen-token masks of the form's embedding and output rows (none in a space)."""
    if data is None:
        return {}
    masks = token_row_masks(form.module, form.a, data)
    return {k: m for k, m in masks.items() if not any(u.axis % form.a[k].ndim == 0
                                                     for _, u in form.spec.uses_of(k))}  # fmt: skip


def align_models(
    a: LoadedModel,
    b: LoadedModel,
    *,
    method: str = "weight",
    symmetry: str | None = None,
    circuits: bool | None = None,
    head_bases: bool = False,
    data: Dataset | None = None,
    mask_unseen: bool = True,
    seed: int = 0,
    config: Any = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    example_inputs: ExampleInputs | None = None,
    spec: SymmetrySpec | None = None,
) -> AlignedPair:
    """Align model ``b`` to ``a``: choose and prepare the pair's form, run the method, move B.

    Args:
        a, b: two models of one architecture (lmckit checkpoints or Hugging Face folders,
            :func:`lmckit.load_model`).
        method: ``weight`` (data-free), ``activation`` or ``learned`` (need ``data``).
        symmetry: as :func:`lmckit.recipe.aligned_form`.
        circuits: ``None``: the form measured best for the method and symmetry
            (:func:`lmckit.forms.choose_form`); ``True`` / ``False``: the circuit /
            projected form.
        head_bases: afterwards align the bases inside matched attention heads.
        data: training data for activation statistics or learned matching; checked to
            fit the model whenever given. Weight matching uses it too when given: its
            default start becomes ``"best"`` (the start whose midpoint has the lower
            training loss) and tokens that never occur are masked.
        mask_unseen: with token data, leave the embedding and output rows of tokens that
            never occur in the training split out of weight matching (they stay at their
            random initialisation and only add noise).
        seed: the method's randomness.
        config: the method's config (:attr:`lmckit.aligners.registry.AlignerInfo.config`,
            e.g. a :class:`lmckit.aligners.LearnedMatchingConfig`); ``None``: its defaults
            (weight matching with data: ``start="best"``).
        device: where the method runs its tensor work (results come back on the CPU).
        progress: progress bars.
        example_inputs: inputs to trace the architecture with (see
            :func:`lmckit.recipe.aligned_form`); default: a zoo model's or a Hugging Face
            model's own.
        spec: A's module's own spec (:func:`lmckit.recipe.spec_of`) if the caller has
            inferred it already, e.g. before loading B (the inference checks the spec on
            a float64 copy of a model up to 134M parameters: done first, that copy is
            never beside both models).

    Raises:
        ValueError: a user mistake (unknown method, missing data, incompatible options, a
            symmetry the architecture cannot have).
    """
    from lmckit.aligners import WeightMatchingConfig, head_bases_matching

    if method not in ALIGN_METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(ALIGN_METHODS)}")
    full = ALIGN_METHODS[method]
    info = aligner_info(full)
    if info.needs_data and data is None:
        raise ValueError(f"{full} needs data: pass data=")
    if data is not None:
        check_data_fits(a.module, data)
    choice = choose_pair_form(
        a, method=method, symmetry=symmetry, circuits=circuits, head_bases=head_bases
    )
    if method == "weight" and config is None and data is not None:
        config = WeightMatchingConfig(start="best")
    candidates = [choice]
    if circuits is None and data is not None and method == "weight":
        candidates += _other_forms(a, choice, method, symmetry, head_bases)
    runs = []
    for candidate in candidates:
        form = pair_form(a, b, candidate, example_inputs, spec)
        masks = _row_masks(form, data) if mask_unseen else {}
        options: dict[str, Any] = {"row_masks": masks} if masks and info.takes("row_masks") else {}
        run = AlignRun(model=form.module, data=data, seed=seed, progress=progress, device=device)
        result = info.run(form.spec, form.a, form.b, config, run, **options)
        runs.append((candidate, form, masks, options, result))
    form_losses: dict[str, float] = {}
    if len(runs) > 1:
        assert data is not None
        for candidate, form, _, _, result in runs:
            form_losses[candidate.name] = _path_midpoint_loss(form, candidate, result, data)
        best = min(range(len(runs)), key=lambda k: form_losses[runs[k][0].name])
        runs = [runs[best]]
    choice, form, masks, options, result = runs[0]
    spec, pa, pb = form.spec, form.a, form.b
    # checked on B itself before anything is returned or written: a space whose element
    # changes B's outputs is left out (the spec was checked on A only)
    module_b, params_b = _b_as_aligned(a, b, form)
    checked = computed_once(
        lambda: check_b_function(module_b, params_b, result.transform, form.inputs)
    )
    if checked.dropped:
        kept = {k: v for k, v in result.spaces.items() if k not in checked.dropped}
        result = replace(result, transform=checked.transform, spaces=kept)
    aligned: Mapping[str, Tensor]
    if head_bases:
        moved = apply(spec, pb, result.transform)
        aligned = head_bases_matching(spec, pa, moved).apply(moved)
        _check_head_bases(module_b, params_b, aligned, form.inputs)
    else:  # moved as it is written (one tensor at a time), not as a second model beside B
        aligned = MovedParams(spec, pb, result.transform)
    metadata = _metadata(info, symmetry, seed, head_bases, config, choice, form, result)
    metadata["b_function"] = checked.metadata()
    if "row_masks" in options:
        metadata["masked_rows"] = {k: int((~m).sum()) for k, m in masks.items()}
    if form_losses:
        metadata["form_midpoint_losses"] = form_losses
    same = written_alike(form.module, a.module)
    reference = pa if (form.rewritten or form.folded or not same) else None
    return AlignedPair(form.module, aligned, reference, result, form.form, same, metadata, choice,
                       checked.left_out)  # fmt: skip


def _b_as_aligned(a: LoadedModel, b: LoadedModel, form: AlignForm) -> tuple[nn.Module, Any]:
    """The module and parameters B's own outputs are computed with: B's own module
    when the form is the models' own (its buffers and code, not A's), else the form's
    module with B in that form (the same function: every form is an exact rewrite)."""
    if form.module is a.module and form.b is b.params:
        return b.module, b.params
    return form.module, form.b


def _check_head_bases(
    module: nn.Module, params_b: Any, aligned: Mapping[str, Tensor], inputs: ExampleInputs
) -> None:
    """Refuse bases inside heads that change B's outputs (they rotate within heads,
    which per-head constants or a nonlinearity there would forbid)."""
    error = computed_once(lambda: outputs_changed(module, params_b, aligned, inputs))
    if error > B_RTOL:
        raise BFunctionError(
            f"aligning the bases inside heads changes B's outputs on the example inputs by "
            f"{error:.2g} (relative; at most {B_RTOL:g} allowed); align without head_bases"
        )


def _other_forms(
    a: LoadedModel, choice: FormChoice, method: str, symmetry: str | None, head_bases: bool
) -> list[FormChoice]:
    """With training data the form is chosen as the start is: every other form the model
    can take that is written as ``choice`` is (the lower midpoint training loss wins)."""
    names = possible_forms(a.module, method, symmetry, head_bases, convertible(a))
    others = [n for n in names if n != choice.name and _written_alike(n, choice)]
    return [
        replace(choice, name=n, circuits=FORMS[n].circuits, path_circuits=FORMS[n].path_circuits)
        for n in others
    ]


def _metadata(
    info: AlignerInfo,
    symmetry: str | None,
    seed: int,
    head_bases: bool,
    config: Any,
    choice: FormChoice,
    form: AlignForm,
    result: AlignmentResult,
) -> dict[str, Any]:
    """What the aligned output records of the run: the request, the form (what barrier
    and merge read to measure the path in this form), the method's config as run and
    what its result says of itself (:meth:`AlignmentResult.metadata`)."""
    config = config if config is not None or info.config is None else info.config()
    return {
        "method": info.name,
        "symmetry": symmetry,
        "seed": seed,
        "head_bases": head_bases,
        "circuits": choice.circuits,
        "form": form.form,
        "form_choice": choice.to_dict(),
        "folded_norm_scales": sorted(form.folded),
        "config": None if config is None else asdict(config),
        **result.metadata(),
    }


def _written_alike(name: str, choice: FormChoice) -> bool:
    """Whether the form ``name`` is written as ``choice`` is (both in lmckit's own model
    or both in the input's class), so that the output's kind does not depend on data."""
    form, chosen = FORMS[name], FORMS[choice.name]
    needs_zoo = form.circuits or form.path_circuits or form.rms
    return needs_zoo == (chosen.circuits or chosen.path_circuits or chosen.rms or choice.to_zoo)


def _path_midpoint_loss(
    form: AlignForm, choice: FormChoice, result: AlignmentResult, data: Dataset
) -> float:
    """Training loss of the midpoint of A and B aligned, on the path ``choice`` measures
    (heads interpolated as circuits when its path says so)."""
    aligned = apply(form.spec, form.b, result.transform)
    module: nn.Module = form.module
    pa: Mapping[str, Tensor] = form.a
    pb: Mapping[str, Tensor] = aligned
    if choice.path_circuits and not choice.circuits:
        circuit = aligned_form(module, pa, pb, circuits=True)
        module, pa, pb = circuit.module, circuit.a, circuit.b
    return midpoint_loss(module, pa, pb, data)


def check_align_request(
    method: str,
    *,
    symmetry: str | None = None,
    circuits: bool | None = None,
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
        raise ValueError("head_bases=True aligns bases inside heads; circuits=True leaves none")
    info = aligner_info(ALIGN_METHODS[method])
    if info.needs_data and not has_data:
        raise ValueError(f"{info.name} needs data: pass data=")
    return info
