"""Step 1 of ``align``: one immutable plan, built once from model A and a request.

:func:`plan_alignment` checks the request (:class:`~lmckit.plan.AlignRequest`),
chooses the form (:func:`lmckit.forms.choose_form`) and works it out on model A: its
graph traced once, its steps named (:class:`~lmckit.forms.Rewrite`), before model B is
read. It decides what will be written (:class:`OutputPlan`): B's own format and class
for a Hugging Face folder, whatever the form (B aligned in lmckit's form is lifted back
into its class, :mod:`lmckit.plan._lift`). :meth:`AlignPlan.describe` says both in a line
each; :meth:`AlignPlan.run` is step 3 (:func:`lmckit.plan.run_plan`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from lmckit._errors import Param, ParameterError, Worded, literal, worded
from lmckit.aligners._registry import AlignerInfo
from lmckit.aligners._result import AlignmentResult
from lmckit.data import Dataset
from lmckit.data._fit import check_data_fits
from lmckit.formats._loaded import LoadedModel, check_output_dtype
from lmckit.forms._choice import FORMS, FormChoice, possible_forms
from lmckit.forms._recipe import AlignForm, written_alike
from lmckit.groups import Orthogonal
from lmckit.outputs import OutputKind
from lmckit.plan._form import choose_model_form, convertible, model_form
from lmckit.plan._request import AlignRequest

if TYPE_CHECKING:
    from lmckit.plan._run import AlignedPair

__all__ = ["AlignPlan", "OutputPlan", "plan_alignment", "writes_reference"]


@dataclass(frozen=True)
class OutputPlan:
    """What ``align`` writes, decided before model B is read.

    Attributes:
        kind: the output policy's kind of what is written (:mod:`lmckit.outputs`).
        format: the format B aligned is written in (``"hf"``, ``"lmckit"``, ``"module"``).
        dtype: the floating dtype a Hugging Face output is stored in (``None``: B's).
        lift: B is aligned in lmckit's form and written back in its own class.
        class_name: the class B is written as.
        reference: A is written beside B (``reference``), in the form B is written in,
            because that differs from A as given (:func:`writes_reference`).
    """

    kind: OutputKind
    format: str
    dtype: torch.dtype | None
    lift: bool
    class_name: str
    reference: bool = False

    def describe(self) -> str:
        """One line: what will be written."""
        what = {"hf": "a Hugging Face folder", "lmckit": "an lmckit checkpoint",
                "module": "a safetensors file"}[self.format]  # fmt: skip
        beside = ", A as written beside it" if self.reference else ""
        how = "; aligned in lmckit's form, the form recorded" if self.lift else ""
        return f"writes: B aligned as {what} of {self.class_name}{beside}{how}"


@dataclass(frozen=True, eq=False)
class AlignPlan:
    """The plan of one alignment (:func:`plan_alignment`); immutable.

    Attributes:
        request: what was asked.
        info: the method's registry entry (what it declares it needs and takes).
        config: the method's config as it will run (the start rule resolved).
        a: model A.
        choice: the form chosen (:class:`~lmckit.forms.FormChoice`).
        others: with training data, the other forms tried (the lower midpoint training
            loss wins); empty otherwise.
        form: model A in the chosen form: its steps, worked out once on A's graph.
        output: what will be written.
    """

    request: AlignRequest
    info: AlignerInfo
    config: Any
    a: LoadedModel
    choice: FormChoice
    others: tuple[FormChoice, ...]
    form: AlignForm
    output: OutputPlan

    @property
    def steps(self) -> tuple[str, ...]:
        """The form's steps, by identifier (``("to_zoo", "rmsnorm", "circuits")``)."""
        return self.form.names

    @property
    def chosen_on_data(self) -> bool:
        """The form is chosen on training data after aligning (said then, not before)."""
        return self._chooses_on_data(self.request, self.info)

    @staticmethod
    def _chooses_on_data(request: AlignRequest, info: AlignerInfo) -> bool:
        # with training data the form is chosen as the start is
        return request.circuits is None and request.has_data and "start" in info.options

    def describe(self) -> list[Worded]:
        """Step 2: the form in one line (unless it is chosen on data, after aligning),
        and what will be written in another."""
        lines = [] if self.chosen_on_data else [self.choice.described()]
        return [*lines, worded(literal(self.output.describe()))]

    def check_data(self, data: Dataset | None) -> None:
        """Refuse data the request did not announce (or announced and not given), and
        data that does not fit model A."""
        if (data is not None) != self.request.has_data:
            said = "has_data=True" if self.request.has_data else "no data"
            raise ParameterError(f"the plan was made with {said}: give {{data}} as planned",
                                 data=Param("data"))  # fmt: skip
        if data is not None:
            check_data_fits(self.a.module, data)

    def metadata(
        self, choice: FormChoice, form: AlignForm, result: AlignmentResult
    ) -> dict[str, Any]:
        """What the aligned output records of the run: the request, the form (what
        barrier and merge read to measure the path in this form), the method's config as
        run and what its result says of itself."""
        config = self.config
        return {
            "method": self.info.name,
            "symmetry": self.request.symmetry,
            "seed": self.request.seed,
            "head_bases": self.request.head_bases,
            "circuits": choice.circuits,
            "form": form.form,
            "form_steps": list(form.names),
            "form_choice": choice.to_dict(),
            "folded_norm_scales": sorted(form.folded),
            "config": None if config is None else asdict(config),
            **result.metadata(),
        }

    def run(
        self,
        b: LoadedModel,
        data: Dataset | None = None,
        *,
        device: str | torch.device | None = None,
        progress: bool = False,
    ) -> AlignedPair:
        """Step 3: :func:`lmckit.plan.run_plan` of this plan on model B."""
        from lmckit.plan._run import run_plan

        return run_plan(self, b, data, device=device, progress=progress)


def _reached_alike(name: str, choice: FormChoice) -> bool:
    """Whether the form ``name`` is reached as ``choice`` is (both through lmckit's own
    model or both in the input's class), so that the forms compared on data are
    aligned from the same model."""
    needs_zoo = FORMS[name].rewrites
    return needs_zoo == (choice.form.rewrites or choice.to_zoo)


def _other_forms(
    a: LoadedModel, choice: FormChoice, request: AlignRequest
) -> tuple[FormChoice, ...]:
    """Every other form the model can take that is reached as ``choice`` is."""
    names = possible_forms(a.module, request.method, request.symmetry, request.head_bases,
                           convertible(a))  # fmt: skip
    return tuple(
        replace(choice, name=n, circuits=FORMS[n].circuits, path_circuits=FORMS[n].path_circuits)
        for n in names
        if n != choice.name and _reached_alike(n, choice)
    )


def writes_reference(form: AlignForm, a: LoadedModel, *, lift: bool) -> bool:
    """Whether A as written beside B differs from A as given, so that it is written: the
    one decision of it. A form of the models' own class with norm scales folded, or
    lmckit's rewrite of them, does; B lifted back into its class does when the
    transform is applied in the RMSNorm form (a dense map of its stream: its norm
    scales are folded there, :mod:`lmckit.plan._lift`)."""
    if lift:
        dense = any(isinstance(space.group, Orthogonal) for space in form.spec)
        return "rmsnorm" in form.names and dense
    return form.rewritten or bool(form.folded) or not written_alike(form.module, a.module)


def _output(a: LoadedModel, form: AlignForm, request: AlignRequest) -> OutputPlan:
    """What is written: B's format and class when the form keeps it or B is lifted back
    into it; lmckit's model of the form (a checkpoint) otherwise."""
    lift = form.names[:1] == ("to_zoo",)
    own = lift or written_alike(form.module, a.module)
    module = a.module if own else form.module
    kind: OutputKind = a.output_kind if own else "checkpoint"
    name = a.format.name if own else "lmckit"
    check_output_dtype(request.dtype, kind)
    reference = writes_reference(form, a, lift=lift)
    return OutputPlan(kind, name, request.dtype, lift, type(module).__name__, reference)


def plan_alignment(a: LoadedModel, request: AlignRequest | None = None, **asked: Any) -> AlignPlan:
    """Step 1 of ``align``: the plan of aligning a model B to ``a``.

    Args:
        a: model A (:func:`lmckit.load`).
        request: what is asked (:class:`~lmckit.plan.AlignRequest`); or its
            fields as keywords (``method="learned", has_data=True``).

    Raises:
        ParameterError: a request no model makes right (see
            :meth:`AlignRequest.checked`), a form the method does not align in, a dtype
            for an output that is not a Hugging Face folder.
        ValueError: a symmetry or form the architecture cannot have (saying why).
    """
    request = request if request is not None else AlignRequest(**asked)
    info, config = request.checked()
    choice = choose_model_form(
        a,
        method=request.method,
        symmetry=request.symmetry,
        circuits=request.circuits,
        head_bases=request.head_bases,
    )
    if info.forms is not None and choice.name not in info.forms:
        raise ParameterError(
            f"{{method}} aligns in the forms {', '.join(info.forms)}, not {choice.name}",
            method=Param("method", request.method),
        )
    chooses = AlignPlan._chooses_on_data(request, info)
    others = _other_forms(a, choice, request) if chooses else ()
    # A's spec is inferred (and checked: on a float64 copy of a model up to 134M
    # parameters) before B is read, so that copy never sits beside both models
    form = model_form(a, choice, request.example_inputs)
    output = _output(a, form, request)
    return AlignPlan(request, info, config, a, choice, others, form, output)
