"""The form in which two models are aligned: one entry point, :func:`aligned_form`.

Aligning starts by choosing the symmetry to align under and the form of the network
that exposes it. Every step is exact (the functions do not change) and is read from the
module's traced graph (:mod:`lmckit.inference`), so it works for the zoo, Hugging Face models
and a user's own modules alike:

* ``symmetry=None``: the module's inferred spec, models as they are;
* ``"permutation"``: orthogonal spaces become permutation spaces (the permutations-only
  ablation);
* ``"orthogonal"``: a spec that already has orthogonal spaces is kept; a zoo transformer
  with LayerNorms is rewritten to its RMSNorm form
  (:func:`lmckit.forms.layernorm_to_rmsnorm`, a new zoo configuration); otherwise norm
  scales and shifts are folded into the layers that read them
  (:func:`lmckit.inference.fold_norm_scales`: an RMSNorm-normalised stream then admits every
  rotation, a LayerNorm-normalised one the rotations that fix the mean direction, and the
  module keeps its class, so a Hugging Face folder stays one);
* ``circuits=True`` (zoo transformers): attention heads are rewritten as their QK/OV
  circuits (:func:`lmckit.forms.heads_to_circuits`), keeping the groups the symmetry
  chose.

The command line, the experiments and the scripts all go through here; which form a
pair is aligned in by default is :mod:`lmckit.forms._choice`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from torch import Tensor, nn

from lmckit._errors import ParameterError
from lmckit.forms._steps import STEP_LABELS, AlignForm, Rewrite, step_label
from lmckit.groups import CenteredOrthogonal, HeadPermutation, Orthogonal, Permutation
from lmckit.inference import analyze_symmetries, infer_spec
from lmckit.inference._fold import fold_norm_scales
from lmckit.inference._inputs import ExampleInputs, split_inputs
from lmckit.inference._untie import untie_refused, untied_module, untied_params
from lmckit.models import ZooModel
from lmckit.runtime._distributed import computed_once
from lmckit.symmetry._params import Params, as_module, as_params
from lmckit.symmetry._transform import SymmetrySpec

__all__ = [
    "STEP_LABELS",
    "SYMMETRIES",
    "AlignForm",
    "Rewrite",
    "aligned_form",
    "check_symmetry",
    "default_inputs",
    "form_of",
    "has_rotations",
    "layernorm_error",
    "spec_of",
    "step_label",
    "written_alike",
]

#: Values of ``symmetry`` besides ``None``.
SYMMETRIES = ("permutation", "orthogonal")


def check_symmetry(symmetry: str | None) -> None:
    """``ValueError`` unless ``symmetry`` is ``None`` or one of :data:`SYMMETRIES`."""
    if symmetry is not None and symmetry not in SYMMETRIES:
        raise ParameterError(
            f"{{symmetry}} must be one of {', '.join(SYMMETRIES)} or None, got {symmetry!r}",
            symmetry="symmetry",
        )


def default_inputs(module: nn.Module) -> ExampleInputs:
    """Example inputs of a zoo model or a Hugging Face model (from its config; with the
    keyword inputs that put every parameter on the traced path, :mod:`lmckit.hf._masked`).

    Raises:
        ValueError: any other module (pass ``example_inputs`` yourself).
    """
    if isinstance(module, ZooModel):
        return module.example_inputs()
    if getattr(module, "main_input_name", None) is not None:  # a transformers model
        from lmckit.hf._masked import example_call

        return example_call(module)
    raise ValueError(
        f"lmckit cannot make example inputs for a {type(module).__name__}: pass example_inputs"
    )


def spec_of(
    module: nn.Module, inputs: ExampleInputs | None = None, *, params: Params | None = None
) -> SymmetrySpec:
    """The module's inferred symmetry spec (the zoo's is inferred once per architecture).

    With a process group (:mod:`lmckit.runtime._distributed`) process 0 infers and checks it, which
    reads the parameters' values, and sends it to the others: every process calls this.
    """
    if isinstance(module, ZooModel) and inputs is None and params is None:
        return module.symmetry_spec()
    names = module.space_names if isinstance(module, ZooModel) else None
    given = inputs if inputs is not None else default_inputs(module)
    return computed_once(lambda: infer_spec(module, given, names=names, params=params))


def _permutations_only(spec: SymmetrySpec) -> SymmetrySpec:
    """The discrete part of ``spec``: orthogonal streams become permutation spaces, and
    continuous maps inside heads (value and query/key bases) are left out."""
    kept = tuple(s for s in spec if not s.enclosed or s.group.units(s.n) is not None)
    rotations = {s.name: Permutation() for s in kept if isinstance(s.group, Orthogonal)}
    return SymmetrySpec(kept, spec.meta).with_groups(**rotations)


def has_rotations(spec: SymmetrySpec) -> bool:
    """Whether a stream (a space not nested inside heads) admits rotations."""
    return any(isinstance(s.group, Orthogonal) for s in spec if not s.enclosed)


@dataclass(frozen=True)
class _Formed:
    """A model part-way through its form: module, parameters, spec and steps so far."""

    module: nn.Module
    params: Mapping[str, Tensor]
    spec: SymmetrySpec
    steps: tuple[Rewrite, ...] = ()
    folded: frozenset[str] = frozenset()


def _no_rotations(module: nn.Module, skipped: tuple[str, ...], names: list[str]) -> ValueError:
    why = "; ".join(skipped) or "every space passes through ops that act unit by unit"
    return ValueError(
        f"{type(module).__name__} has no space that admits orthogonal maps ({why}): its "
        f"spaces {', '.join(names)} allow permutations only"
    )


def _fold_norms(
    module: nn.Module, params: Mapping[str, Tensor], inputs: ExampleInputs, analysis: Any
) -> _Formed:
    """Norm scales folded into the layers that read them (a tied reader given its own copy
    first, so that it can take a scale); the module keeps its class.

    Raises:
        ValueError: no scale folds into a stream that then admits rotations, saying why.
    """
    names = module.space_names if isinstance(module, ZooModel) else None
    fa = fold_norm_scales(analysis, params)
    steps: list[Rewrite] = []
    refused = untie_refused(module) if fa.tied else None
    if refused:
        fa = replace(fa, skipped=(*fa.skipped, refused))
    elif fa.tied and not isinstance(module, ZooModel):
        untied = untied_module(module, fa.tied)
        for key, tied_to in sorted(fa.tied.items()):
            steps.append(Rewrite(f"untie:{key}", module, untied,
                                 partial(untied_params, keys={key: tied_to})))  # fmt: skip
        module, params = untied, untied_params(params, fa.tied)
        analysis = analyze_symmetries(
            module, inputs, names=names, params=params, check=False, decide=False
        )
        fa = fold_norm_scales(analysis, params)
    if fa.scales:
        spec = computed_once(
            lambda: infer_spec(module, inputs, names=names, params=fa.params, uniform=fa.scales)
        )
        if has_rotations(spec):
            fold = Rewrite("fold_norms", module, module,
                           lambda p: fold_norm_scales(analysis, p).params)  # fmt: skip
            return _Formed(module, fa.params, spec, (*steps, fold), fa.scales)
    raise _no_rotations(module, fa.skipped, list(analysis.spec.names))


def _rmsnorm(module: ZooModel, params: Mapping[str, Tensor]) -> _Formed:
    """lmckit's own transformer rewritten from LayerNorm to RMSNorm (a new architecture)."""
    from lmckit.forms._rewrites import centred_streams, layernorm_to_rmsnorm

    try:
        rms, ra = layernorm_to_rmsnorm(module, dict(params))
    except ValueError as err:
        raise ValueError(
            f"symmetry='orthogonal' needs the exact LayerNorm -> RMSNorm rewrite: {err}"
        ) from None
    spec = rms.symmetry_spec()
    # the rewrite centres every writer of the streams its norms read: each stream stays
    # in the zero-mean subspace, whose rotations are the maps with Q 1 = 1 (the ones a
    # LayerNorm of the model's own class commutes with, so B aligned is written in it)
    centred = {name: CenteredOrthogonal() for name in centred_streams(module)
               if name in spec.names and type(spec[name].group) is Orthogonal}  # fmt: skip
    step = Rewrite("rmsnorm", module, rms, lambda p: layernorm_to_rmsnorm(module, dict(p))[1])
    return _Formed(rms, ra, spec.with_groups(**centred), (step,))


def _orthogonal(module: nn.Module, params: Mapping[str, Tensor], inputs: ExampleInputs) -> _Formed:
    """The model in a form whose stream admits orthogonal maps (the module docstring)."""
    names = module.space_names if isinstance(module, ZooModel) else None
    # the graph's analysis is all the route needs: no value of the model is read for it
    analysis = analyze_symmetries(
        module, inputs, names=names, params=params, check=False, decide=False
    )
    if isinstance(module, ZooModel) and any(site.kind == "layer" for site in analysis.scales):
        # the zoo's own rewrite reaches every orthogonal map, not only those fixing the mean
        return _rmsnorm(module, params)
    return _fold_norms(module, params, inputs, analysis)


def _circuits(formed: _Formed) -> _Formed:
    """Attention heads rewritten as QK/OV circuits, keeping the groups chosen so far."""
    module = formed.module
    if not isinstance(module, ZooModel):
        raise ValueError(
            f"the circuit form rewrites lmckit's own transformers; {type(module).__name__} is "
            "not one"
        )
    from lmckit.forms._rewrites import heads_to_circuits

    circuit, params, steps = module, formed.params, formed.steps
    if module.config.kwargs.get("attention") != "circuits":  # else nothing to rewrite
        try:
            # a zoo model's form is a plain state dict (only folding makes lazy ones)
            circuit, params = heads_to_circuits(module, dict(formed.params))
        except ValueError:
            raise ValueError(
                f"the circuit form rewrites attention heads as QK/OV circuits; "
                f"{module.config.name} has no attention heads"
            ) from None
        step = Rewrite("circuits", module, circuit,
                       lambda p: heads_to_circuits(module, dict(p))[1])  # fmt: skip
        steps = (*steps, step)
    full = circuit.symmetry_spec()
    chosen = formed.spec
    # keep the groups the symmetry chose (the permutations-only ablation); circuit
    # heads are plain permutations of whole circuits
    kept = {
        s.name: chosen[s.name].group
        for s in full
        if s.name in chosen.names and not isinstance(chosen[s.name].group, HeadPermutation)
    }
    return _Formed(circuit, params, full.with_groups(**kept), steps, formed.folded)


def written_alike(form_module: nn.Module, module: nn.Module) -> bool:
    """Whether a model in a form whose module is ``form_module`` is written as a model
    of ``module`` is: the same module, or a copy of a ``transformers``-style module with
    a tied weight untied (lmckit's own rewrites are new zoo configurations)."""
    return form_module is module or (
        not isinstance(form_module, ZooModel) and type(form_module) is type(module)
    )


def layernorm_error(module: nn.Module) -> ValueError:
    return ValueError(
        f"{type(module).__name__} normalises its residual stream with LayerNorm, whose "
        "mean subtraction only commutes with permutations; an orthogonal map needs the "
        "exact LayerNorm -> RMSNorm rewrite, which changes the architecture (lmckit "
        "does it for its own GPT-2 and ViT, and for their Hugging Face folders)"
    )


def form_of(
    module: nn.Module,
    params: Mapping[str, Tensor],
    *,
    symmetry: str | None = None,
    circuits: bool = False,
    example_inputs: ExampleInputs | None = None,
    rms: bool = False,
    spec: SymmetrySpec | None = None,
) -> AlignForm:
    """One model in the form it is aligned in: :func:`aligned_form` of model A alone
    (``b`` is ``a``), whose :meth:`AlignForm.with_b` puts model B in the same form.

    See :func:`aligned_form` for the arguments and what is raised.
    """
    check_symmetry(symmetry)
    as_module(module, "module")
    as_params(params, "params")
    if example_inputs is not None:
        split_inputs(example_inputs)  # a wrong type is refused before any work
    inputs = example_inputs if example_inputs is not None else default_inputs(module)
    if spec is None:
        spec = spec_of(module) if example_inputs is None else spec_of(module, inputs)
    formed = _Formed(module, params, spec)
    if symmetry == "permutation":
        if rms and not has_rotations(spec):
            formed = _orthogonal(module, params, inputs)
        formed = replace(formed, spec=_permutations_only(formed.spec))
    elif symmetry == "orthogonal" and not has_rotations(spec):
        formed = _orthogonal(module, params, inputs)
    if circuits:
        formed = _circuits(formed)
    if isinstance(formed.module, ZooModel):
        inputs = formed.module.example_inputs()
    return AlignForm(formed.module, formed.params, formed.params, formed.spec, formed.steps,
                     formed.folded, inputs)  # fmt: skip


def aligned_form(
    module: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    *,
    symmetry: str | None = None,
    circuits: bool = False,
    example_inputs: ExampleInputs | None = None,
    rms: bool = False,
    spec: SymmetrySpec | None = None,
) -> AlignForm:
    """Two models of ``module``'s architecture in the form they are aligned in.

    The form is a list of named steps (:class:`Rewrite`), worked out on ``params_a``
    (one analysis of the graph, traced once) and applied to ``params_b`` in turn.

    Args:
        module: the architecture (any module ``torch.export`` traces).
        params_a, params_b: the two models; not modified.
        symmetry: ``None`` (the inferred groups), ``"permutation"`` or ``"orthogonal"``.
        circuits: zoo transformers: rewrite attention heads as QK/OV circuits first.
        rms: with ``symmetry="permutation"``, rewrite a LayerNorm stream to the RMSNorm
            form first, as ``"orthogonal"`` does (the stream centred, the norms' scales
            and biases folded into their readers), and permute it there.
        example_inputs: inputs for tracing: a tensor, a tuple of positional inputs or a
            dict of keyword inputs (default: :func:`default_inputs`).
        spec: ``module``'s own spec (:func:`spec_of`) when the caller has inferred it
            already, e.g. before reading ``params_b``, so that the inference's check
            never holds its copy of the model beside both models; default: inferred here.

    Raises:
        TypeError: example inputs of another type (naming what is expected).
        ValueError: an unknown symmetry, a symmetry the architecture cannot have (saying
            why), or circuits for a model without projected attention heads.
    """
    as_params(params_a, "params_a")
    as_params(params_b, "params_b")
    form = form_of(module, params_a, symmetry=symmetry, circuits=circuits,
                   example_inputs=example_inputs, rms=rms, spec=spec)  # fmt: skip
    return form.with_b(params_b)
