"""B aligned in lmckit's form, written back in its own class: the transform lifted.

A Hugging Face GPT-2 or ViT folder is aligned in a form only lmckit's own model has
(converted, perhaps rewritten to RMSNorm, heads as QK/OV circuits). The transform found
there is carried back to B's own class, so that ``lmckit align`` writes a folder of
B's class whatever the form, and ``barrier`` / ``merge`` put it in the recorded form:

* through the circuits, by space name: the residual, head and MLP spaces of the circuit
  form are those of the projected form (a head's circuit moves with the head); the
  bases inside heads, which circuits do not see, stay as B has them;
* through the RMSNorm rewrite, when every element is a permutation: a permutation of
  the stream commutes with a LayerNorm and its scale, so B is moved in its LayerNorm
  form. An orthogonal stream element ``Q`` (``Q 1 = 1``: the RMSNorm form's stream is
  centred, :func:`lmckit.forms._recipe.form_of`) is applied in the RMSNorm form, which is then
  written in the LayerNorm class (:func:`layernorm_class_params`: each norm's scale one,
  its shift folded into the readers' biases; a reader without a bias in the class, the
  LM head, reads a shift of ones instead);
* through the conversion, by the converter's names inverted
  (:func:`lmckit.hf.hf_from_zoo`).

The result is checked on B's own module before anything is written: it must compute
B's outputs (to :data:`~lmckit.workflow._b_function.B_RTOL`), or it is not used (and the
form is written as an lmckit checkpoint, said in one line).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmckit.formats._loaded import LoadedModel
from lmckit.forms._recipe import AlignForm, Rewrite, default_inputs
from lmckit.forms._rewrites import folded_readers
from lmckit.groups import Orthogonal
from lmckit.hf import hf_from_zoo
from lmckit.inference._untie import untied_module
from lmckit.models import ZooModel
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import SymmetrySpec, Transform, apply
from lmckit.workflow._b_function import B_RTOL, outputs_changed

__all__ = [
    "Lifted",
    "class_module",
    "layernorm_class_params",
    "lift_to_class",
    "point_in_class",
]


@dataclass(frozen=True)
class Lifted:
    """B aligned, and A beside it, in their own class.

    Attributes:
        b: B aligned, under B's own names (its module computes B's function with them).
        a: A in the same class form when it differs from A as given (norm scales
            folded into the readers: measure paths in the class against it); ``None``.
        steps: the steps the transform was applied after (``("to_zoo",)``,
            ``("to_zoo", "rmsnorm")``).
        error: the relative change of B's outputs, as checked.
    """

    b: Params
    a: Params | None
    steps: tuple[str, ...]
    error: float


def _level(form: AlignForm, transform: Transform) -> int:
    """How many of the form's steps the transform is applied after: the circuits are
    left out (by space name), and the RMSNorm rewrite too when every element is a
    permutation (it commutes with a LayerNorm)."""
    names = list(form.names)
    if names and names[-1] == "circuits":
        names.pop()
    dense = any(isinstance(transform.spec[n].group, Orthogonal) for n in transform.elements)
    if names and names[-1] == "rmsnorm" and not dense:
        names.pop()
    return len(names)


def _level_spec(module: nn.Module, transform: Transform) -> SymmetrySpec | str:
    """The spec of the form at the level (its spaces under the transform's groups where
    they are dense maps; the bases inside heads are not moved)."""
    if not isinstance(module, ZooModel):
        return f"{type(module).__name__} is not lmckit's own model"
    spec = module.symmetry_spec()
    missing = sorted(set(transform.elements) - set(spec.names))
    if missing:
        return f"the form's spaces {missing} are not spaces of {module.config.name}"
    dense = {n: transform.spec[n].group for n in transform.elements
             if isinstance(transform.spec[n].group, Orthogonal)}  # fmt: skip
    return spec.with_groups(**dense)


def _through(steps: tuple[Rewrite, ...], params: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
    for step in steps:
        params = step.apply(params)
    return params


def layernorm_class_params(
    module: ZooModel, class_keys: set[str], rms: Mapping[str, Tensor]
) -> Params | str:
    """Parameters of the RMSNorm form of ``module`` (a LayerNorm model lmckit rewrote,
    :func:`lmckit.forms.layernorm_to_rmsnorm`) written as ``module``'s own class:
    exact for a stream of mean zero (the RMSNorm form's writers are centred).

    Each LayerNorm's scale becomes one and its shift zero (the RMSNorm form holds both in
    its readers). A reader whose bias the class does not have (``class_keys``: every key
    of the class, an untied LM head included) reads a shift of ones instead:
    ``W' = W C + beta 1^T / n`` (``C`` centres) computes ``W`` on the zero-mean
    normalised stream and ``beta`` on the ones.
    """
    out: Params = {k: v for k, v in rms.items() if k in class_keys}
    template = module.state_dict()
    for scale, shift, readers in folded_readers(module, template):
        out[scale] = torch.ones_like(template[scale])
        out[shift] = torch.zeros_like(template[shift])
        biasless = [(r, k) for r, k in readers if k not in class_keys]
        for reader, bias_key in biasless:
            weight = rms.get(reader.weight)
            if weight is None or bias_key not in rms or reader.weight not in class_keys:
                return f"the class has no bias for {reader.weight} to hold its norm's shift"
            w = weight.double().movedim(reader.axis, -1)  # (..., in)
            beta = rms[bias_key].double()
            centred = w - w.mean(dim=-1, keepdim=True) + beta[..., None] / w.shape[-1]
            out[reader.weight] = centred.movedim(-1, reader.axis).to(weight.dtype)
        if biasless:
            out[shift] = torch.ones_like(template[shift])
            for reader, bias_key in readers:  # the readers with a bias see the ones too
                if bias_key in class_keys and bias_key in out:
                    seen = rms[reader.weight].double().movedim(reader.axis, -1).sum(dim=-1)
                    out[bias_key] = (out[bias_key].double() - seen).to(out[bias_key].dtype)
    return out


def class_module(model: LoadedModel, params: Mapping[str, Tensor]) -> nn.Module:
    """``model``'s module, or a copy of it with the weights ``params`` unties given their
    own (a folded LM head beside the embedding it was tied to); not holding ``params``."""
    state = model.module.state_dict(keep_vars=True)
    ties: dict[int, str] = {}
    untie: dict[str, str] = {}
    for name, tensor in state.items():
        first = ties.setdefault(id(tensor), name)
        if first != name and name in params and not torch.equal(params[name], params[first]):
            untie[name] = first
    return untied_module(model.module, untie) if untie else model.module


def _checked(b: LoadedModel, lifted: Params) -> float:
    """The relative change of B's outputs in its own class holding ``lifted``."""
    module = class_module(b, lifted)
    return outputs_changed(module, b.params, lifted, default_inputs(module))


def _in_class(
    steps: tuple[Rewrite, ...], model: LoadedModel, params: Mapping[str, Tensor]
) -> Params | str:
    """``params`` of the form after ``steps`` (the conversion, perhaps the RMSNorm
    rewrite) under the names of ``model``'s own class, or why they cannot be."""
    zoo: Mapping[str, Tensor] = params
    if steps[-1].name == "rmsnorm":
        ln = steps[-1].before
        assert isinstance(ln, ZooModel)
        found = layernorm_class_params(ln, set(ln.state_dict()) | {"lm_head.weight"}, params)
        if isinstance(found, str):
            return found
        zoo = found
    elif steps[-1].name != "to_zoo":
        return f"no way back from the step {steps[-1].name!r} to the class"
    return hf_from_zoo(model.config, model.params, zoo, set(model.module.state_dict()))


def point_in_class(
    form: AlignForm, model: LoadedModel, params: Mapping[str, Tensor]
) -> Params | str:
    """A point of the path in ``form`` (a merged model) under the names of ``model``'s
    own class, or why no model of the class computes it (heads interpolated as
    circuits: a circuit of rank above a head's width has no projections).

    The result is not checked here: compare it with the point in the form."""
    if not form.names or form.names[0] != "to_zoo":
        return "the form was not reached by converting the folder"
    if "circuits" in form.names:
        return "a point between two circuit forms has circuits no head's projections hold"
    return _in_class(form.steps, model, params)


def lift_to_class(
    form: AlignForm, transform: Transform, a: LoadedModel, b: LoadedModel
) -> Lifted | str:
    """B moved by ``transform`` (found in ``form``) as a model of B's own class, or why
    it cannot be (a form not reached by converting B, an element the class cannot
    take, a result that does not compute B's function).

    Args:
        form: the form the pair was aligned in; its first step converts B's folder.
        transform: the transform found there (checked on B).
        a, b: the two models as loaded.
    """
    if not form.names or form.names[0] != "to_zoo":
        return "the form was not reached by converting the folder"
    steps = form.steps[: _level(form, transform)]
    spec = _level_spec(steps[-1].after, transform)
    if isinstance(spec, str):
        return spec
    try:
        moved = apply(spec, dict(_through(steps, b.params)),
                      Transform(spec, dict(transform.elements)))  # fmt: skip
    except (ValueError, KeyError, TypeError) as err:
        return f"the transform does not fit the class form: {err}"
    lifted_b = _in_class(steps, b, moved)
    if isinstance(lifted_b, str):
        return lifted_b
    error = _checked(b, lifted_b)
    if not error <= B_RTOL:
        return f"B in its class computes another function (relative change {error:.2g})"
    lifted_a = None
    if steps[-1].name == "rmsnorm":  # A as written differs from A: norm scales folded
        found = _in_class(steps, a, _through(steps, a.params))
        lifted_a = found if not isinstance(found, str) else None
    return Lifted(lifted_b, lifted_a, tuple(s.name for s in steps), error)
