"""The form in which two models are aligned: one entry point, :func:`aligned_form`.

Aligning starts by choosing the symmetry to align under and the form of the network
that exposes it. Every step is exact (the functions do not change) and is read from the
module's traced graph (:mod:`lmckit.spec`), so it works for the zoo, Hugging Face models
and a user's own modules alike:

* ``symmetry=None``: the module's inferred spec, models as they are;
* ``"permutation"``: orthogonal spaces become permutation spaces (the permutations-only
  ablation);
* ``"orthogonal"``: a spec that already has orthogonal spaces is kept; a zoo transformer
  with LayerNorms is rewritten to its RMSNorm form
  (:func:`lmckit.rewrites.layernorm_to_rmsnorm`, a new zoo configuration); otherwise norm
  scales and shifts are folded into the layers that read them
  (:func:`lmckit.spec.fold_norm_scales`: an RMSNorm-normalised stream then admits every
  rotation, a LayerNorm-normalised one the rotations that fix the mean direction, and the
  module keeps its class, so a Hugging Face folder stays one);
* ``circuits=True`` (zoo transformers): attention heads are rewritten as their QK/OV
  circuits (:func:`lmckit.rewrites.heads_to_circuits`), keeping the groups the symmetry
  chose.

The command line, the experiments and the scripts all go through here; which form a
pair is aligned in by default is :mod:`lmckit.forms`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from torch import Tensor, nn

from lmckit.distributed import computed_once
from lmckit.groups import HeadPermutation, Orthogonal, Permutation
from lmckit.models import ZooModel
from lmckit.params import Params, as_module, as_params
from lmckit.spec import analyze_symmetries, infer_spec
from lmckit.spec.fold import fold_norm_scales
from lmckit.spec.inputs import ExampleInputs, split_inputs
from lmckit.spec.untie import untie_refused, untied_module, untied_params
from lmckit.symmetry import SymmetrySpec

__all__ = [
    "SYMMETRIES",
    "AlignForm",
    "aligned_form",
    "check_symmetry",
    "default_inputs",
    "has_rotations",
    "layernorm_error",
    "orthogonal_route",
    "spec_of",
    "written_alike",
]

#: Values of ``symmetry`` besides ``None``.
SYMMETRIES = ("permutation", "orthogonal")


@dataclass(frozen=True)
class AlignForm:
    """Two models in the form they are aligned in, and the spec to align under.

    Attributes:
        module: the form's module (the given one unless ``rewritten``).
        a, b: both models' parameters in that form (same functions as given); with
            norm scales folded, a :class:`~lmckit.spec.fold.FoldedParams` that computes
            each folded weight when it is read (no float32 copy of a bfloat16 model).
        spec: the symmetry spec of that form, with the groups ``symmetry`` chose.
        rewritten: the module is a new architecture (RMSNorm form, circuits): results
            are only comparable with ``a`` in this form, and are written in lmckit's form.
        form: what was done, e.g. ``"norm scales folded"``, ``"RMSNorm form and circuit
            form"``; empty when nothing was.
        folded: keys of the norm scales folded into their readers (now all ones).
        inputs: the example inputs the spec was inferred from (a tensor, a tuple of
            positional inputs or a dict of keyword inputs, as given).
    """

    module: nn.Module
    a: Mapping[str, Tensor]
    b: Mapping[str, Tensor]
    spec: SymmetrySpec
    rewritten: bool = False
    form: str = ""
    folded: frozenset[str] = frozenset()
    inputs: ExampleInputs = ()


def check_symmetry(symmetry: str | None) -> None:
    """``ValueError`` unless ``symmetry`` is ``None`` or one of :data:`SYMMETRIES`."""
    if symmetry is not None and symmetry not in SYMMETRIES:
        raise ValueError(
            f"symmetry must be one of {', '.join(SYMMETRIES)} or None, got {symmetry!r}"
        )


def default_inputs(module: nn.Module) -> tuple[Tensor | None, ...]:
    """Example inputs of a zoo model or a Hugging Face model (from its config).

    Raises:
        ValueError: any other module (pass ``example_inputs`` yourself).
    """
    if isinstance(module, ZooModel):
        return module.example_inputs()
    if getattr(module, "main_input_name", None) is not None:  # a transformers model
        from lmckit.hf import example_inputs

        return example_inputs(module)
    raise ValueError(
        f"lmckit cannot make example inputs for a {type(module).__name__}: pass example_inputs"
    )


def spec_of(
    module: nn.Module, inputs: ExampleInputs | None = None, *, params: Params | None = None
) -> SymmetrySpec:
    """The module's inferred symmetry spec (the zoo's is inferred once per architecture).

    With a process group (:mod:`lmckit.distributed`) process 0 infers and checks it, which
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
class _OrthogonalRoute:
    """How a module without rotations in its spec admits them: ``"fold"`` (norm scales
    folded into their readers; ``a``, ``b``, ``spec``, ``scales`` hold the result, and
    ``module`` the module with the weights in ``untied`` given their own copy so that a
    tied reader can take a scale) or ``"rmsnorm"`` (the LayerNorm -> RMSNorm rewrite,
    zoo models only)."""

    route: str
    a: Mapping[str, Tensor] | None = None
    b: Mapping[str, Tensor] | None = None
    spec: SymmetrySpec | None = None
    scales: frozenset[str] = frozenset()
    module: nn.Module | None = None
    untied: tuple[str, ...] = ()


def orthogonal_route(
    module: nn.Module, a: Mapping[str, Tensor], b: Mapping[str, Tensor], inputs: ExampleInputs
) -> _OrthogonalRoute:
    """How the pair reaches a form with an orthogonal stream (module docstring).

    Raises:
        ValueError: no route (no space admits rotations, saying why).
    """
    names = module.space_names if isinstance(module, ZooModel) else None
    # the graph's analysis is all the fold needs: no value of the models is read for it
    analysis = analyze_symmetries(module, inputs, names=names, params=a, check=False, decide=False)
    layer_norms = any(site.kind == "layer" for site in analysis.scales)
    if isinstance(module, ZooModel) and layer_norms:
        # the zoo's own rewrite reaches every orthogonal map, not only those fixing the mean
        return _OrthogonalRoute("rmsnorm")
    fa = fold_norm_scales(analysis, a)
    untied: dict[str, str] = {}
    refused = untie_refused(module) if fa.tied else None
    if refused:
        fa = replace(fa, skipped=(*fa.skipped, refused))
    elif fa.tied and not isinstance(module, ZooModel):
        # a tied reader (an output head sharing the embedding) gets its own copy
        untied = fa.tied
        module = untied_module(module, untied)
        a, b = untied_params(a, untied), untied_params(b, untied)
        analysis = analyze_symmetries(
            module, inputs, names=names, params=a, check=False, decide=False
        )
        fa = fold_norm_scales(analysis, a)
    fb = fold_norm_scales(analysis, b)
    if fa.scales:
        spec = computed_once(
            lambda: infer_spec(module, inputs, names=names, params=fa.params, uniform=fa.scales)
        )
        if has_rotations(spec):
            return _OrthogonalRoute("fold", fa.params, fb.params, spec, fa.scales, module,
                                    tuple(sorted(untied)))  # fmt: skip
    why = "; ".join(fa.skipped) or "every space passes through ops that act unit by unit"
    raise ValueError(
        f"{type(module).__name__} has no space that admits orthogonal maps ({why}): its "
        f"spaces {', '.join(analysis.spec.names)} allow permutations only"
    )


def _orthogonal(
    module: nn.Module, a: Mapping[str, Tensor], b: Mapping[str, Tensor], inputs: ExampleInputs
) -> tuple[
    nn.Module, Mapping[str, Tensor], Mapping[str, Tensor], SymmetrySpec, list[str], frozenset[str]
]:
    """The pair in a form with an orthogonal stream (see the module docstring)."""
    route = orthogonal_route(module, a, b, inputs)
    if route.route == "fold":
        assert route.a is not None and route.b is not None and route.spec is not None
        assert route.module is not None
        done = ["norm scales folded"] + [f"{k} untied" for k in route.untied]
        return route.module, route.a, route.b, route.spec, done, route.scales
    if isinstance(module, ZooModel):
        from lmckit.rewrites import layernorm_to_rmsnorm

        try:
            rms, ra = layernorm_to_rmsnorm(module, dict(a))
            _, rb = layernorm_to_rmsnorm(module, dict(b))
        except ValueError as err:
            raise ValueError(
                f"symmetry='orthogonal' needs the exact LayerNorm -> RMSNorm rewrite: {err}"
            ) from None
        return rms, ra, rb, rms.symmetry_spec(), ["RMSNorm form"], frozenset()
    raise layernorm_error(module)


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
    check_symmetry(symmetry)
    as_module(module, "module")
    as_params(params_a, "params_a")
    as_params(params_b, "params_b")
    if example_inputs is not None:
        split_inputs(example_inputs)  # a wrong type is refused before any work
    inputs = example_inputs if example_inputs is not None else default_inputs(module)
    a, b = params_a, params_b
    if spec is None:
        spec = spec_of(module) if example_inputs is None else spec_of(module, inputs)
    parts: list[str] = []
    folded: frozenset[str] = frozenset()
    if symmetry == "permutation":
        if rms and not has_rotations(spec):
            module, a, b, spec, parts, folded = _orthogonal(module, a, b, inputs)
        spec = _permutations_only(spec)
    elif symmetry == "orthogonal" and not has_rotations(spec):
        module, a, b, spec, parts, folded = _orthogonal(module, a, b, inputs)
    rewritten = parts == ["RMSNorm form"]
    if circuits:
        if not isinstance(module, ZooModel):
            raise ValueError(
                f"the circuit form rewrites lmckit's own transformers; {type(module).__name__} is "
                "not one"
            )
        from lmckit.rewrites import heads_to_circuits

        chosen = spec
        if module.config.kwargs.get("attention") == "circuits":
            circuit = module  # already in circuit form: nothing to rewrite
        else:
            try:
                # a zoo model's form is a plain state dict (only folding makes lazy ones)
                circuit, a = heads_to_circuits(module, dict(a))
                _, b = heads_to_circuits(module, dict(b))
            except ValueError:
                name = module.config.name
                raise ValueError(
                    f"the circuit form rewrites attention heads as QK/OV circuits; {name} has no "
                    "attention heads"
                ) from None
        full = circuit.symmetry_spec()
        # keep the groups the symmetry chose (the permutations-only ablation); circuit
        # heads are plain permutations of whole circuits
        kept = {
            s.name: chosen[s.name].group
            for s in full
            if s.name in chosen.names and not isinstance(chosen[s.name].group, HeadPermutation)
        }
        module, spec, rewritten = circuit, full.with_groups(**kept), True
        parts.append("circuit form")
    if isinstance(module, ZooModel):
        inputs = module.example_inputs()
    return AlignForm(module, a, b, spec, rewritten, " and ".join(parts), folded, inputs)
