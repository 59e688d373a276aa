"""The form a model is in, read from its weights as well as from its record.

``lmckit align --symmetry orthogonal`` on a model of another class than lmckit's own
folds its norm scales into their readers (each scale becomes ones, a LayerNorm's shift
zeros) and rotates its stream: the class and the config stay, so the folder looks like
any other of its class. ``lmckit.json`` records it (``form_choice``,
``folded_norm_scales``) and ``barrier`` and ``merge`` put the other model in that form
first. Without the record (weights copied without it) or with an edited one, a path
would interpolate an unfolded A with a folded, rotated B: the ends would be right and
every point between them wrong. :func:`checked_form` reads the fold from the weights
(norm scales at their folded value in one model and not in the other) and checks the
record's claims against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from torch import Tensor

from lmckit.formats._io import LoadedModel
from lmckit.forms._choice import FormChoice
from lmckit.forms._recipe import default_inputs
from lmckit.inference import analyze_symmetries
from lmckit.inference._trace import SpecInferenceError
from lmckit.models import ZooModel
from lmckit.symmetry._params import IncompatibleModelsError

__all__ = ["checked_form"]

#: The form a folded model was aligned in when its record does not say: norm scales
#: folded (``symmetry="orthogonal"`` on a model of its own class), heads as projections.
FOLDED = FormChoice("projected", "orthogonal", False, False, False, False)


def _name(model: LoadedModel) -> str:
    return str(model.path) if model.path is not None else "the model held in memory"


def _at(params: Mapping[str, Tensor], key: str, value: float) -> bool:
    tensor = params[key]
    return bool(tensor.numel()) and bool((tensor == value).all())


def _constant_vectors(params: Mapping[str, Tensor]) -> set[str]:
    """Keys of the floating vectors that are all ones or all zeros (a folded scale or
    shift holds one of them): a cheap sign that a model may be folded."""
    return {
        k
        for k, v in params.items()
        if v.ndim == 1 and v.is_floating_point() and (_at(params, k, 1.0) or _at(params, k, 0.0))
    }


def _scales(model: LoadedModel) -> dict[str, float] | str:
    """``{norm scale key: its folded value}`` from the module's graph, or why it cannot
    be told."""
    try:
        inputs = default_inputs(model.module)
        analysis = analyze_symmetries(model.module, inputs, check=False, decide=False)
    except (ValueError, TypeError, SpecInferenceError) as err:
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    keys = analysis.traced.params
    return {keys[s.weight]: 1.0 - s.offset for s in analysis.scales
            if s.weight is not None and s.weight in keys}  # fmt: skip


def _claimed(meta: Mapping[str, Any]) -> list[str]:
    folded = meta.get("folded_norm_scales")
    return [k for k in folded if isinstance(k, str)] if isinstance(folded, list) else []


def checked_form(
    a: LoadedModel,
    b: LoadedModel,
    choice: FormChoice | None,
    records: tuple[Mapping[str, Any], Mapping[str, Any]],
) -> tuple[FormChoice | None, str]:
    """The form the pair's path is measured in, checked against the weights.

    Args:
        a, b: the two models.
        choice: the form their records name (``None``: none).
        records: what lmckit recorded of ``a`` and ``b`` (``{}``: nothing).

    Returns:
        the form (``choice``, or the folded form when the weights show a fold no record
        names) and a note for the user (empty when the records say it all).

    Raises:
        IncompatibleModelsError: a record that says norm scales are folded where the
            weights show they are not.
    """
    if isinstance(a.module, ZooModel) or isinstance(b.module, ZooModel):
        return choice, ""  # lmckit's own models change their config in every form
    claims = [_claimed(r) for r in records]
    # a record's claims are checked without the graph: a folded scale is all ones (all
    # zeros where the norm multiplies by 1 + w), a scale in use is neither
    for model, claim in zip((a, b), claims, strict=True):
        wrong = [k for k in claim if k in model.params and not _folded_value(model.params, k)]
        if wrong:
            raise IncompatibleModelsError(
                f"{_name(model)}: lmckit.json says its norm scales are folded, but "
                f"{wrong[0]} is not at its folded value: the record does not describe "
                "these weights"
            )
    folds = choice is not None and choice.symmetry == "orthogonal"
    if any(claims):
        if folds:
            return choice, ""
        model = a if claims[0] else b
        why = "its lmckit.json names the scales folded, its form_choice another form"
        return _folded(choice, model, why)
    hints = _constant_vectors(a.params) ^ _constant_vectors(b.params)
    if folds or not hints:
        return choice, ""
    scales = _scales(a)
    if isinstance(scales, str):
        return choice, f"cannot tell from the weights whether a model is folded ({scales})"
    units = [
        {k for k, v in scales.items() if k in m.params and _at(m.params, k, v)} for m in (a, b)
    ]
    for model, unit, other, record in zip((a, b), units, units[::-1], records, strict=True):
        if unit - other:
            said = "no lmckit.json" if not record else "an lmckit.json naming another form"
            why = (
                f"{len(unit)} of {len(scales)} norm scales at their folded value, "
                f"{len(other)} in the other model, {said}"
            )
            return _folded(choice, model, why)
    return choice, ""


def _folded_value(params: Mapping[str, Tensor], key: str) -> bool:
    return _at(params, key, 1.0) or _at(params, key, 0.0)


def _folded(choice: FormChoice | None, model: LoadedModel, why: str) -> tuple[FormChoice, str]:
    """The folded form, and the note saying which model showed it and how."""
    note = f"{_name(model)} is in the folded form ({why}): the path is measured in that form"
    return (FOLDED if choice is None else replace(choice, symmetry="orthogonal")), note
