"""Step 3 of ``align``: the plan run on model B, B's function checked, the result.

:func:`run_plan` puts B in the plan's form (the steps worked out on A, nothing of A
read again), runs the method (with training data and weight matching, every form the
model can take that is written as the chosen one, keeping the one whose midpoint has
the lower training loss), checks the transform on B itself
(:func:`~lmckit.workflow._b_function.check_b_function`), aligns the bases inside heads
when asked, and says how B aligned is written (:class:`Written`: in B's own format,
lifted back into its class when it was aligned in lmckit's form, or as an lmckit
checkpoint of the form when no class holds it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from lmckit.aligners._result import AlignmentResult
from lmckit.aligners._run import AlignRun
from lmckit.aligners._weight.start_choice import midpoint_loss
from lmckit.data import Dataset
from lmckit.data._token_stats import token_row_masks
from lmckit.formats._checkpoint import held_checkpoint
from lmckit.formats._loaded import LoadedModel
from lmckit.forms._choice import FormChoice
from lmckit.forms._recipe import AlignForm, aligned_form, written_alike
from lmckit.models import ZooModel
from lmckit.plan._form import model_form
from lmckit.plan._lift import lift_to_class
from lmckit.plan._plan import AlignPlan, writes_reference
from lmckit.runtime._distributed import computed_once
from lmckit.symmetry._transform import MovedParams, apply
from lmckit.workflow._b_function import B_RTOL, BFunctionError, check_b_function, outputs_changed

__all__ = ["AlignedPair", "Written", "run_plan"]


@dataclass(frozen=True)
class Written:
    """B aligned as it is written, and A beside it when A as written differs from A.

    Attributes:
        like: a model of the format and class B is written in (B itself, or lmckit's
            model of the form, as a checkpoint).
        params: B aligned, as written.
        reference: A as written beside B (``None``: A as given is the other end).
        record: what the output records beyond the run's metadata.
        note: one line for the user when B is not written in its input's format.
        reference_like: the model of the format and class A is written in (``None``:
            ``like``'s).
    """

    like: LoadedModel
    params: Mapping[str, Tensor]
    reference: Mapping[str, Tensor] | None = None
    record: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    reference_like: LoadedModel | None = None


@dataclass(frozen=True)
class AlignedPair:
    """What :func:`run_plan` returns.

    Attributes:
        module: the architecture of the aligned B in its form.
        params: B aligned in that form, each tensor computed when read
            (:class:`~lmckit.symmetry.MovedParams`; a plain dict after head bases).
        reference: A in the same form when that differs from A as given, else ``None``.
        result: the aligner's result (transform, per-space diagnostics).
        form: the form (:class:`~lmckit.forms.AlignForm`: its steps, spec, inputs).
        choice: the form chosen (also in ``metadata["form_choice"]``).
        metadata: method, options and diagnostics, JSON-ready.
        left_out: one line per space whose element changed B's outputs and was reset
            to the identity (also in ``metadata["b_function"]``).
        written: how B aligned is written (:class:`Written`).
    """

    module: nn.Module
    params: Mapping[str, Tensor]
    reference: Mapping[str, Tensor] | None
    result: AlignmentResult
    form: AlignForm
    choice: FormChoice
    metadata: dict[str, Any]
    left_out: tuple[str, ...]
    written: Written


def _row_masks(form: AlignForm, data: Dataset | None) -> dict[str, Tensor]:
    """Unseen-token masks of the form's embedding and output rows (none in a space)."""
    if data is None:
        return {}
    masks = token_row_masks(form.module, form.a, data)
    return {k: m for k, m in masks.items() if not any(u.axis % form.a[k].ndim == 0
                                                     for _, u in form.spec.uses_of(k))}  # fmt: skip


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


class _Run(NamedTuple):
    """One candidate form, run: the form (with B), the row masks and method options
    given, the method's result."""

    choice: FormChoice
    form: AlignForm
    masks: dict[str, Tensor]
    options: dict[str, Any]
    result: AlignmentResult


def _aligned_in(plan: AlignPlan, choice: FormChoice, form: AlignForm, b: LoadedModel,
                data: Dataset | None, device: Any, progress: bool) -> _Run:  # fmt: skip
    """One candidate form run."""
    form = form.with_b(b.params)
    masks = _row_masks(form, data) if plan.request.mask_unseen else {}
    options: dict[str, Any] = {"row_masks": masks} if masks and plan.info.takes("row_masks") else {}
    run = AlignRun(model=form.module, data=data, seed=plan.request.seed, progress=progress,
                   device=device)  # fmt: skip
    result = plan.info.run(form.spec, form.a, form.b, plan.config, run, **options)
    return _Run(choice, form, masks, options, result)


def _best_run(plan: AlignPlan, b: LoadedModel, data: Dataset | None, device: Any,
              progress: bool) -> tuple[_Run, dict[str, float]]:  # fmt: skip
    """The chosen form's run, or with several candidates the one whose midpoint has the
    lower training loss, and the losses."""
    runs = [_aligned_in(plan, plan.choice, plan.form, b, data, device, progress)]
    for other in plan.others:
        form = model_form(plan.a, other, plan.request.example_inputs)
        runs.append(_aligned_in(plan, other, form, b, data, device, progress))
    if len(runs) == 1:
        return runs[0], {}
    assert data is not None
    losses = {r.choice.name: _path_midpoint_loss(r.form, r.choice, r.result, data) for r in runs}
    return min(runs, key=lambda r: losses[r.choice.name]), losses


def _b_as_aligned(a: LoadedModel, b: LoadedModel, form: AlignForm) -> tuple[nn.Module, Any]:
    """The module and parameters B's own outputs are computed with: B's own module
    when the form is the models' own (its buffers and code, not A's), else the form's
    module with B in that form (the same function: every form is an exact rewrite)."""
    if form.module is a.module and form.b is b.params:
        return b.module, b.params
    return form.module, form.b


def _checked(a: LoadedModel, b: LoadedModel, form: AlignForm,
             result: AlignmentResult) -> tuple[AlignmentResult, Any]:  # fmt: skip
    """The result with the spaces that change B's outputs left out, and the check."""
    module_b, params_b = _b_as_aligned(a, b, form)
    checked = computed_once(
        lambda: check_b_function(module_b, params_b, result.transform, form.inputs)
    )
    if checked.dropped:
        kept = {k: v for k, v in result.spaces.items() if k not in checked.dropped}
        result = replace(result, transform=checked.transform, spaces=kept)
    return result, checked


def _head_bases(a: LoadedModel, b: LoadedModel, form: AlignForm,
                result: AlignmentResult) -> dict[str, Tensor]:  # fmt: skip
    """B moved, then each matched head's bases aligned to A's; refused if that changes
    B's outputs (per-head constants or a nonlinearity inside heads would)."""
    from lmckit.aligners import head_bases_matching

    moved = apply(form.spec, form.b, result.transform)
    aligned = head_bases_matching(form.spec, form.a, moved).apply(moved)
    module, params_b = _b_as_aligned(a, b, form)
    error = computed_once(lambda: outputs_changed(module, params_b, aligned, form.inputs))
    if error > B_RTOL:
        raise BFunctionError(
            f"aligning the bases inside heads changes B's outputs on the example inputs by "
            f"{error:.2g} (relative; at most {B_RTOL:g} allowed); align without head_bases"
        )
    return aligned


def _written(plan: AlignPlan, b: LoadedModel, form: AlignForm, result: AlignmentResult,
             params: Mapping[str, Tensor], reference: Any) -> Written:  # fmt: skip
    """How B aligned is written: in B's format (lifted into its class when it was
    aligned in lmckit's form), else the form as an lmckit checkpoint."""
    if written_alike(form.module, plan.a.module):
        return Written(b, params, reference, reference_like=plan.a)
    lifted = lift_to_class(form, result.transform, plan.a, b) if plan.output.lift else None
    if lifted is not None and not isinstance(lifted, str):
        record = {"stored_form": "class", "lifted_after": list(lifted.steps)}
        beside = lifted.a if writes_reference(form, plan.a, lift=True) else None
        return Written(b, lifted.b, beside, record, reference_like=plan.a)
    assert isinstance(form.module, ZooModel)  # a rewrite's new form is a zoo configuration
    note = ""
    if b.format.name != "lmckit":
        why = f" ({lifted})" if isinstance(lifted, str) else ""
        note = (f"{form.form or 'the form'} cannot be written as {type(b.module).__name__}"
                f"{why}; wrote an lmckit checkpoint instead")  # fmt: skip
    return Written(held_checkpoint(form.module), params, reference, note=note)


def run_plan(
    plan: AlignPlan,
    b: LoadedModel,
    data: Dataset | None = None,
    *,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> AlignedPair:
    """Align ``b`` to the plan's model A (:func:`lmckit.plan.plan_alignment`).

    Args:
        plan: the plan (model A, the method, the form, the output).
        b: model B, of A's architecture (``lmckit.load(path, like=plan.a)``).
        data: training data, as the plan's request said (checked to fit the model).
        device: where the method runs its tensor work (results come back on the CPU).
        progress: progress bars.

    Raises:
        ParameterError: data given to a plan made without it, or missing.
        BFunctionError: the transform changes B's outputs (nothing is returned).
    """
    plan.check_data(data)
    best, losses = _best_run(plan, b, data, device, progress)
    choice, form, masks, options, result = best
    result, checked = _checked(plan.a, b, form, result)
    aligned: Mapping[str, Tensor]
    if plan.request.head_bases:
        aligned = _head_bases(plan.a, b, form, result)
    else:  # moved as it is written (one tensor at a time), not as a second model beside B
        aligned = MovedParams(form.spec, form.b, result.transform)
    metadata = plan.metadata(choice, form, result)
    metadata["b_function"] = checked.metadata()
    if "row_masks" in options:
        metadata["masked_rows"] = {k: int((~m).sum()) for k, m in masks.items()}
    if losses:
        metadata["form_midpoint_losses"] = losses
    # A in the form, the other end of the path in it (what Aligned.barrier measures from)
    reference = form.a if writes_reference(form, plan.a, lift=False) else None
    written = _written(plan, b, form, result, aligned, reference)
    return AlignedPair(form.module, aligned, reference, result, form, choice, metadata,
                       checked.left_out, written)  # fmt: skip
