"""Points and paths between models: a merged point, the barrier of a pair (the
multi-model barrier over a simplex: :mod:`lmckit.workflow._simplex`)."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmckit._errors import Param
from lmckit._registry import check_needs
from lmckit.data import Dataset
from lmckit.data._fit import check_data_fits
from lmckit.formats._checkpoint import CheckpointError, held_checkpoint, load_metadata
from lmckit.formats._io import LoadedModel, check_same_config, model_format
from lmckit.forms._choice import FORMS, FormChoice
from lmckit.forms._recipe import AlignForm, aligned_form, written_alike
from lmckit.hf._files import MAX_CONFIG_BYTES, read_json_file
from lmckit.measure._evaluate import PathResult
from lmckit.measure._measure import (
    MERGE_FIXES,
    MERGE_METHOD_OF_FIX,
    EvalSettings,
    check_fix,
    measure_path,
    train_inputs,
)
from lmckit.merging._methods import check_t, merge, merge_info
from lmckit.models import ZooModel
from lmckit.outputs._folders import HF_MARKER
from lmckit.plan._form import model_form
from lmckit.symmetry._params import IncompatibleModelsError, Params, check_compatible, module_params
from lmckit.workflow._form_evidence import checked_form

#: Config entries a recorded form may change: folding a norm scale into a tied head unties it.
UNTIED = frozenset({"tie_word_embeddings"})

__all__ = [
    "MERGE_FIXES",
    "PathForm",
    "merge_pair",
    "pair_barrier",
    "path_form",
    "recorded_form",
    "recorded_metadata",
    "written_point",
]


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
    check_t(t)
    check_fix(fix, MERGE_FIXES)
    info = merge_info(MERGE_METHOD_OF_FIX[fix])
    check_needs(Param("fix", fix), info, data=data is not None)
    if data is not None:
        check_data_fits(model, data)
    inputs = train_inputs(data, settings or EvalSettings()) if data is not None else None
    return merge(info.name, params_a, params_b, t, model=model, inputs=inputs)


def recorded_metadata(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """What lmckit recorded of the output at ``path`` (an HF folder's ``lmckit.json``
    ``metadata``, a checkpoint's ``metadata``); ``{}`` for none, or no path."""
    if path is None:
        return {}
    folder = Path(path)
    try:
        if model_format(folder) == "hf":
            marker = folder / HF_MARKER
            if not marker.is_file():
                return {}
            meta = read_json_file(marker, max_bytes=MAX_CONFIG_BYTES, what="lmckit.json")
            meta = meta.get("metadata", {}) if isinstance(meta, dict) else {}
        else:
            meta = load_metadata(folder)
    except (CheckpointError, OSError):
        return {}  # loading the model reports the problem in its own words
    return meta if isinstance(meta, dict) else {}


def recorded_form(path: str | os.PathLike[str] | None) -> FormChoice | None:
    """The form an lmckit output at ``path`` says it is in (``lmckit align`` records it),
    or ``None`` (no record, not an lmckit output, or a model held in memory: no path).
    Reads the metadata only."""
    return FormChoice.from_dict(recorded_metadata(path).get("form_choice"))


@dataclass(frozen=True)
class PathForm:
    """Two models in the form their path is measured in (:func:`path_form`).

    Attributes:
        module: the form's architecture.
        a, b: both models' parameters in it.
        choice: the form recorded by ``lmckit align`` (``None``: none recorded).
        circuits: heads are interpolated as QK/OV circuits.
        same_as_a: ``module`` is the first model's own architecture (a merge is written
            in its format); ``False``: lmckit's own model of the form.
        note: what was done, for the user (empty when nothing was).
        steps: the first model put in the recorded form (its named steps: a point of
            the path is written back in the model's class through them, unless heads
            are interpolated as circuits); ``None``: it was not put in a form.
    """

    module: nn.Module
    a: Params
    b: Params
    choice: FormChoice | None
    circuits: bool
    same_as_a: bool
    note: str = ""
    steps: AlignForm | None = None


def path_form(a: LoadedModel, b: LoadedModel, *, circuits: bool | None = None) -> PathForm:
    """Both models in the form their path is measured in, as ``lmckit align`` recorded it.

    A model written by ``lmckit align`` records its form (:class:`FormChoice`); the other
    model, when it carries no record (the original A beside the aligned B), is put in
    the same form (exact: the same function), and the path interpolates heads as
    circuits when the form says so. ``circuits`` (``True`` / ``False``) overrides that.
    """
    records = recorded_metadata(a.path), recorded_metadata(b.path)
    recorded = [
        (m.path, c)
        for m, r in ((b, records[1]), (a, records[0]))
        if (c := FormChoice.from_dict(r.get("form_choice"))) is not None
    ]
    recorded_in, choice = recorded[0] if recorded else (None, None)
    try:
        # a recorded form changes the shapes, never the config or the storage (a folded
        # LM head is untied); and a fold no record names shows in the weights
        check_same_config(a, b, ignore=UNTIED if choice is not None else frozenset())
        choice, evidence = checked_form(a, b, choice, records)
    except IncompatibleModelsError as err:
        raise IncompatibleModelsError(
            f"{a.path} and {b.path} are different architectures: {err}"
        ) from None
    with _as_recorded(recorded_in, choice, asked=False):
        module, pa, pb, notes, steps = _in_recorded_form(a, b, choice, records)
    if evidence:
        notes.insert(0, evidence)
    use_circuits = circuits if circuits is not None else bool(choice and choice.path_circuits)
    if use_circuits:
        with _as_recorded(recorded_in, choice, asked=circuits is not None):
            form = aligned_form(module, pa, pb, circuits=True)
        if form.module is not module:
            notes.append("heads interpolated as circuits")
        module, pa, pb = form.module, dict(form.a), dict(form.b)
    same = written_alike(module, a.module)
    return PathForm(module, pa, pb, choice, use_circuits, same, "; ".join(notes), steps)


def written_point(
    a: LoadedModel, form: PathForm, point: Mapping[str, Tensor]
) -> tuple[LoadedModel, Mapping[str, Tensor], str]:
    """How a point of the path (a merged model) is written: ``(a model of the format
    and class it is written as, its parameters, a note for the user)``.

    In A's format when the path's form is A's own architecture; lifted back into A's
    class when the form is lmckit's form of a Hugging Face folder and the heads are not
    interpolated as circuits (:func:`lmckit.plan._lift.point_in_class`); otherwise as
    lmckit's model of the form, an lmckit checkpoint (the note says so when A is not
    one: a point between two circuit forms has circuits no head's projections hold).
    """
    from lmckit.plan._lift import point_in_class

    if form.same_as_a:
        return a, point, ""
    why = "no form was recorded"
    if form.steps is not None and not form.circuits:
        own = point_in_class(form.steps, a, point)
        if not isinstance(own, str):
            return a, own, ""
        why = own
    elif form.circuits:
        why = "heads interpolated as QK/OV circuits: no class of projected heads holds them"
    module = form.module
    assert isinstance(module, ZooModel)  # a form of lmckit's own model
    note = "" if a.format.name == "lmckit" else (
        f"the point cannot be written as {type(a.module).__name__} ({why}); wrote an lmckit "
        "checkpoint instead"
    )  # fmt: skip
    return held_checkpoint(module), point, note


@contextlib.contextmanager
def _as_recorded(path: Path | None, choice: FormChoice | None, *, asked: bool) -> Iterator[None]:
    """A form the user did not ask for, but a model's record names, that the pair cannot
    take: said as the record's, not as an option the user never gave."""
    try:
        yield
    except IncompatibleModelsError:
        raise
    except ValueError as err:
        if choice is None or asked:
            raise
        raise ValueError(
            f"{path} records that `lmckit align` wrote it in the form {choice.name!r}, which "
            f"this pair cannot take ({err}); the record does not fit these models"
        ) from None


def _in_recorded_form(
    a: LoadedModel,
    b: LoadedModel,
    choice: FormChoice | None,
    records: tuple[dict[str, Any], dict[str, Any]],
) -> tuple[nn.Module, Params, Params, list[str], AlignForm | None]:
    """Both models in the form ``choice`` (a model whose record names no form, or says
    it is stored in its own class, is put in it), after checking the pair is one
    architecture there; and model A's steps into the form (``None``: A was in it)."""
    module, pa, pb = a.module, a.params, b.params
    notes: list[str] = []
    if choice is None:
        return module, pa, pb, notes, None
    formed: list[tuple[nn.Module, Params, AlignForm | None]] = []
    changes = (
        choice.to_zoo
        or choice.circuits
        or choice.symmetry == "orthogonal"
        or FORMS[choice.name].rms
    )
    for model, record in zip((a, b), records, strict=True):
        in_form = FormChoice.from_dict(record.get("form_choice")) is not None
        # a model lmckit wrote in its own class ("stored_form": "class") is put in the
        # form like one with no record
        if changes and not (in_form and record.get("stored_form") != "class"):
            form = model_form(_float32(model), choice)
            formed.append((form.module, dict(form.a), form))
            if form.form:
                name = model.path.name if model.path is not None else "the model"
                notes.append(f"{name} put in {form.form}")
        else:
            formed.append((model.module, model.params, None))
    (module, pa, steps), (module_b, pb, _) = formed
    try:
        if module is not module_b and _config(module) != _config(module_b):
            raise IncompatibleModelsError(f"{_config(module)} vs {_config(module_b)}")
        check_compatible(pa, pb)
    except IncompatibleModelsError as err:
        raise IncompatibleModelsError(
            f"{a.path} and {b.path} are different architectures even in the form "
            f"`lmckit align` recorded ({choice.name}): {err}"
        ) from None
    return module, pa, pb, notes, steps


def _float32(model: LoadedModel) -> LoadedModel:
    """``model`` with float32 weights when some are bfloat16 or float16 (a copy): a
    rewrite into another form computes as on a float32 load, whatever the stored dtype."""
    low = (torch.bfloat16, torch.float16)
    if not any(v.dtype in low for v in model.params.values()):
        return model
    module = copy.deepcopy(model.module).float()
    return replace(model, module=module, params=module_params(module))


def _config(module: nn.Module) -> Any:
    return module.config if isinstance(module, ZooModel) else type(module)


def pair_barrier(
    a: LoadedModel,
    b: LoadedModel,
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    circuits: bool | None = None,
    meta: dict[str, Any] | None = None,
    progress: bool = False,
) -> PathResult:
    """Loss and accuracy along the linear path from ``a`` to ``b`` on ``data``.

    The path is measured in the form ``lmckit align`` recorded in either model
    (:func:`path_form`); ``circuits`` overrides whether heads are interpolated as
    QK/OV circuits (the ends are the same functions; the path between them differs).
    """
    form = path_form(a, b, circuits=circuits)
    check_data_fits(form.module, data)
    info = {**(meta or {}), "circuits": form.circuits}
    if form.choice is not None:
        info["form_choice"] = form.choice.to_dict()
    if form.note:
        info["form"] = form.note
    return measure_path(form.module, form.a, form.b, data, settings, meta=info, progress=progress)
