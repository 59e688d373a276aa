"""A loaded model in a form: the form chosen for it, and its steps worked out on it.

:func:`model_form` puts one loaded model (model A) in the form a :class:`FormChoice`
names: a Hugging Face GPT-2 or ViT folder is first converted to lmckit's own model (the
``to_zoo`` step, from the weights already in memory), then the recipe's steps follow
(:func:`lmckit.forms._recipe.form_of`: folded norms, RMSNorm, circuits), worked out once on
its graph; :meth:`~lmckit.forms.AlignForm.with_b` puts another model of the same
architecture (model B) through the same steps.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lmckit.formats._loaded import LoadedModel
from lmckit.forms._choice import FormChoice, choose_form
from lmckit.forms._recipe import AlignForm, Rewrite, form_of
from lmckit.hf._zoo import ZOO_CONVERSIONS, zoo_from_state
from lmckit.inference._inputs import ExampleInputs
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import SymmetrySpec

__all__ = ["choose_model_form", "convertible", "model_form", "pair_form"]


def convertible(model: LoadedModel) -> bool:
    """Whether ``model`` is a Hugging Face folder lmckit converts into one of its own
    models (:data:`lmckit.hf.ZOO_CONVERSIONS`), whose rewrites (RMSNorm, circuits) it
    has. A module held in memory is aligned as it is (its class's own forms)."""
    config = model.config
    return (
        model.path is not None
        and model.format.name == "hf"
        and isinstance(config, Mapping)
        and config.get("model_type") in ZOO_CONVERSIONS
    )


def choose_model_form(
    model: LoadedModel,
    *,
    method: str = "weight",
    symmetry: str | None = None,
    circuits: bool | None = None,
    head_bases: bool = False,
) -> FormChoice:
    """:func:`lmckit.forms.choose_form` for a loaded model (Hugging Face GPT-2 and ViT
    folders may take the zoo's forms)."""
    return choose_form(model.module, method=method, symmetry=symmetry, circuits=circuits,
                       head_bases=head_bases, convertible=convertible(model))  # fmt: skip


def _to_zoo(model: LoadedModel) -> tuple[Rewrite, Params]:
    """The conversion of a Hugging Face folder held in memory into lmckit's own model
    (the folder is not read again), and the model's parameters converted."""
    config = dict(model.config)
    where = model.path or "the model"

    def convert(params: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
        return zoo_from_state(config, params, where=where)[1]

    zoo, params = zoo_from_state(config, model.params, where=where)
    return Rewrite("to_zoo", model.module, zoo, convert), params


def model_form(
    model: LoadedModel,
    choice: FormChoice,
    example_inputs: ExampleInputs | None = None,
    spec: SymmetrySpec | None = None,
) -> AlignForm:
    """``model`` in the form ``choice`` names (``b`` is ``a``: put another model in it
    with :meth:`~lmckit.forms.AlignForm.with_b`).

    Args:
        model: the loaded model (model A).
        choice: the form (:func:`choose_model_form`).
        example_inputs: inputs to trace the architecture with (default: its own).
        spec: the model's own spec if already inferred (not for a converted model).
    """
    rms = choice.form.rms
    if choice.to_zoo and convertible(model):
        step, params = _to_zoo(model)
        form = form_of(step.after, params, symmetry=choice.symmetry, circuits=choice.circuits,
                       rms=rms)  # fmt: skip
        return form.after((step,))
    return form_of(model.module, model.params, symmetry=choice.symmetry, circuits=choice.circuits,
                   example_inputs=example_inputs, rms=rms, spec=spec)  # fmt: skip


def pair_form(
    a: LoadedModel,
    b: LoadedModel,
    choice: FormChoice,
    example_inputs: ExampleInputs | None = None,
    spec: SymmetrySpec | None = None,
) -> AlignForm:
    """Both models in the form ``choice`` names (:func:`model_form` of ``a``, ``b`` put
    through the same steps)."""
    return model_form(a, choice, example_inputs, spec).with_b(b.params)
