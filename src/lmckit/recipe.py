"""The form in which two models are aligned: one entry point, :func:`aligned_form`.

Aligning starts by choosing the symmetry to align under and the form of the network
that exposes it. Every step is exact (the functions do not change) and is read from the
module's traced graph (:mod:`lmckit.spec`), so it works for the zoo, Hugging Face models
and a user's own modules alike:

* ``symmetry=None``: the module's inferred spec, models as they are;
* ``"permutation"``: orthogonal spaces become permutation spaces (the permutations-only
  ablation);
* ``"orthogonal"``: a spec that already has orthogonal spaces is kept; otherwise norm
  scales are folded into the layers that read them (:func:`lmckit.spec.fold_norm_scales`:
  an RMSNorm-normalised stream then admits rotations, and the module keeps its class);
  failing that, a zoo transformer with LayerNorms is rewritten to its RMSNorm form
  (:func:`lmckit.rewrites.layernorm_to_rmsnorm`, a new zoo configuration);
* ``circuits=True`` (zoo transformers): attention heads are rewritten as their QK/OV
  circuits (:func:`lmckit.rewrites.heads_to_circuits`), keeping the groups the symmetry
  chose.

The command line, the experiments and the scripts all go through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from lmckit.groups import HeadPermutation, Orthogonal, Permutation
from lmckit.models import ZooModel
from lmckit.params import Params, as_module, as_params
from lmckit.spec import analyze_symmetries, infer_spec
from lmckit.spec.fold import fold_norm_scales
from lmckit.spec.inputs import ExampleInputs, split_inputs
from lmckit.symmetry import SymmetrySpec

__all__ = [
    "FORMS",
    "PREFERRED_FORMS",
    "SYMMETRIES",
    "AlignForm",
    "Form",
    "FormChoice",
    "aligned_form",
    "check_symmetry",
    "choose_form",
    "default_inputs",
    "possible_forms",
    "spec_of",
]

#: Values of ``symmetry`` besides ``None``.
SYMMETRIES = ("permutation", "orthogonal")


@dataclass(frozen=True)
class AlignForm:
    """Two models in the form they are aligned in, and the spec to align under.

    Attributes:
        module: the form's module (the given one unless ``rewritten``).
        a, b: both models' parameters in that form (same functions as given).
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
    a: Params
    b: Params
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


def default_inputs(module: nn.Module) -> tuple[Tensor, ...]:
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
    """The module's inferred symmetry spec (the zoo's is inferred once per architecture)."""
    if isinstance(module, ZooModel) and inputs is None and params is None:
        return module.symmetry_spec()
    names = module.space_names if isinstance(module, ZooModel) else None
    given = inputs if inputs is not None else default_inputs(module)
    return infer_spec(module, given, names=names, params=params)


def _permutations_only(spec: SymmetrySpec) -> SymmetrySpec:
    """The discrete part of ``spec``: orthogonal streams become permutation spaces, and
    continuous maps inside heads (value and query/key bases) are left out."""
    kept = tuple(s for s in spec if s.nest is None or s.group.units(s.n) is not None)
    rotations = {s.name: Permutation() for s in kept if isinstance(s.group, Orthogonal)}
    return SymmetrySpec(kept, spec.meta).with_groups(**rotations)


def _has_rotations(spec: SymmetrySpec) -> bool:
    """Whether a stream (a space not nested inside heads) admits rotations."""
    return any(isinstance(s.group, Orthogonal) for s in spec if s.nest is None)


@dataclass(frozen=True)
class _OrthogonalRoute:
    """How a module without rotations in its spec admits them: ``"fold"`` (norm scales
    folded into their readers; ``a``, ``b``, ``spec``, ``scales`` hold the result) or
    ``"rmsnorm"`` (the LayerNorm -> RMSNorm rewrite, zoo models only)."""

    route: str
    a: Params | None = None
    b: Params | None = None
    spec: SymmetrySpec | None = None
    scales: frozenset[str] = frozenset()


def _orthogonal_route(
    module: nn.Module, a: Params, b: Params, inputs: ExampleInputs
) -> _OrthogonalRoute:
    """How the pair reaches a form with an orthogonal stream (module docstring).

    Raises:
        ValueError: no route (no space admits rotations, saying why).
    """
    names = module.space_names if isinstance(module, ZooModel) else None
    analysis = analyze_symmetries(module, inputs, names=names, params=a, check=False)
    fa, fb = fold_norm_scales(analysis, a), fold_norm_scales(analysis, b)
    if fa.scales:
        spec = infer_spec(module, inputs, names=names, params=fa.params, uniform=fa.scales)
        if _has_rotations(spec):
            return _OrthogonalRoute("fold", fa.params, fb.params, spec, fa.scales)
    if any(site.kind == "layer" for site in analysis.scales):
        return _OrthogonalRoute("rmsnorm")
    why = "; ".join(fa.skipped) or "every space passes through ops that act unit by unit"
    raise ValueError(
        f"{type(module).__name__} has no space that admits orthogonal maps ({why}): its "
        f"spaces {', '.join(analysis.spec.names)} allow permutations only"
    )


def _orthogonal(
    module: nn.Module, a: Params, b: Params, inputs: ExampleInputs
) -> tuple[nn.Module, Params, Params, SymmetrySpec, list[str], frozenset[str]]:
    """The pair in a form with an orthogonal stream (see the module docstring)."""
    route = _orthogonal_route(module, a, b, inputs)
    if route.route == "fold":
        assert route.a is not None and route.b is not None and route.spec is not None
        return module, route.a, route.b, route.spec, ["norm scales folded"], route.scales
    if isinstance(module, ZooModel):
        from lmckit.rewrites import layernorm_to_rmsnorm

        rms, ra = layernorm_to_rmsnorm(module, a)
        _, rb = layernorm_to_rmsnorm(module, b)
        return rms, ra, rb, rms.symmetry_spec(), ["RMSNorm form"], frozenset()
    raise _layernorm_error(module)


def _layernorm_error(module: nn.Module) -> ValueError:
    return ValueError(
        f"{type(module).__name__} normalises its residual stream with LayerNorm, whose "
        "mean subtraction only commutes with permutations; an orthogonal map needs the "
        "exact LayerNorm -> RMSNorm rewrite, which changes the architecture (lmckit "
        "does it for its own GPT-2 and ViT, and for their Hugging Face folders)"
    )


def aligned_form(
    module: nn.Module,
    params_a: Params,
    params_b: Params,
    *,
    symmetry: str | None = None,
    circuits: bool = False,
    example_inputs: ExampleInputs | None = None,
    rms: bool = False,
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
    spec = spec_of(module) if example_inputs is None else spec_of(module, inputs)
    parts: list[str] = []
    folded: frozenset[str] = frozenset()
    if symmetry == "permutation":
        if rms and not _has_rotations(spec):
            module, a, b, spec, parts, folded = _orthogonal(module, a, b, inputs)
        spec = _permutations_only(spec)
    elif symmetry == "orthogonal" and not _has_rotations(spec):
        module, a, b, spec, parts, folded = _orthogonal(module, a, b, inputs)
    rewritten = parts == ["RMSNorm form"]
    if circuits:
        if not isinstance(module, ZooModel):
            raise ValueError(
                f"--circuits rewrites lmckit's own transformers; {type(module).__name__} is not one"
            )
        from lmckit.rewrites import heads_to_circuits

        chosen = spec
        if module.config.kwargs.get("attention") == "circuits":
            circuit = module  # already in circuit form: nothing to rewrite
        else:
            try:
                circuit, a = heads_to_circuits(module, a)
                _, b = heads_to_circuits(module, b)
            except ValueError:
                name = module.config.name
                raise ValueError(f"--circuits: {name} has no attention heads") from None
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


# --------------------------------------------------------------------------- form choice


@dataclass(frozen=True)
class Form:
    """A form a pair can be aligned in, and the path it is measured on.

    Attributes:
        circuits: attention heads are rewritten as QK/OV circuits before aligning.
        path_circuits: paths and merges interpolate heads as circuits (the ends are the
            same functions either way; the points between them differ).
        rms: permutations of a LayerNorm stream act on its RMSNorm form (see
            :func:`aligned_form`'s ``rms``), where it is also interpolated.
    """

    circuits: bool
    path_circuits: bool
    rms: bool = False


#: The forms :func:`choose_form` picks from, by name.
FORMS: dict[str, Form] = {
    "projected": Form(circuits=False, path_circuits=False),
    "circuits": Form(circuits=True, path_circuits=True),
    # heads aligned as their projections, interpolated as circuits (as the paper's code)
    "projected, circuit path": Form(circuits=False, path_circuits=True),
    "circuits, RMSNorm form": Form(circuits=True, path_circuits=True, rms=True),
}

#: Default forms, best first, by ``(method, symmetry)``: the first form a model can take
#: is the default (a pair without attention heads, or one whose class lmckit cannot
#: rewrite as circuits, falls through to ``"projected"``). Measured: lowest test-loss
#: barrier on CPU-trained GPT-2 pairs (``docs/experiments/reference_comparison.md``);
#: a new form or a new measurement is a change of this table only.
PREFERRED_FORMS: dict[tuple[str, str | None], tuple[str, ...]] = {
    ("weight", "orthogonal"): ("circuits", "projected, circuit path", "projected"),
    ("weight", "permutation"): (
        "circuits",
        "projected, circuit path",
        "circuits, RMSNorm form",
        "projected",
    ),
    ("weight", None): ("circuits", "projected, circuit path", "projected"),
    ("learned", "orthogonal"): ("circuits", "projected"),
    ("learned", "permutation"): ("circuits", "projected"),
    ("learned", None): ("circuits", "projected"),
}


@dataclass(frozen=True)
class FormChoice:
    """The form :func:`choose_form` picked for a pair: what it is, and why.

    Attributes:
        name: a key of :data:`FORMS`.
        symmetry: the symmetry it was chosen for (``None``: the architecture's groups).
        circuits, path_circuits: as :class:`Form`.
        to_zoo: the form needs a rewrite only lmckit's own models have (LayerNorm ->
            RMSNorm, circuits): a model of another class must be converted to one first.
        chosen: picked by :data:`PREFERRED_FORMS` (``False``: the caller asked for it).
    """

    name: str
    symmetry: str | None
    circuits: bool
    path_circuits: bool
    to_zoo: bool = False
    chosen: bool = True

    def describe(self) -> str:
        """One line for the user: the form and how to get the other."""
        what = {
            "circuits": "attention heads as QK/OV circuits, aligned and interpolated in that form",
            "projected": "attention heads as their projections",
            "projected, circuit path": "attention heads aligned as their projections and "
            "interpolated as QK/OV circuits",
            "circuits, RMSNorm form": "attention heads as QK/OV circuits, the residual stream "
            "permuted and interpolated in its RMSNorm form",
        }.get(self.name, self.name)
        how = "the best measured for this method and symmetry" if self.chosen else "as asked"
        other = " (--no-circuits for the projected form)" if self.circuits and self.chosen else ""
        return f"form: {self.name} ({what}; {how}){other}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for what an aligned model records (:meth:`from_dict` reads it)."""
        return {
            "name": self.name,
            "symmetry": self.symmetry,
            "circuits": self.circuits,
            "path_circuits": self.path_circuits,
            "to_zoo": self.to_zoo,
            "chosen": self.chosen,
        }

    @classmethod
    def from_dict(cls, data: Any) -> FormChoice | None:
        """The choice :meth:`to_dict` wrote, or ``None`` for anything else."""
        if not isinstance(data, dict) or data.get("name") not in FORMS:
            return None
        symmetry = data.get("symmetry")
        if symmetry is not None and symmetry not in SYMMETRIES:
            return None
        flags = [data.get(k) for k in ("circuits", "path_circuits", "to_zoo", "chosen")]
        if not all(isinstance(f, bool) for f in flags):
            return None
        circuits, path_circuits, to_zoo, chosen = (bool(f) for f in flags)
        return cls(data["name"], symmetry, circuits, path_circuits, to_zoo, chosen)


def _circuits_possible(module: nn.Module, convertible: bool) -> bool:
    """Whether the circuit rewrite applies: a zoo transformer, or a model convertible
    into one (its heads are checked when it is rewritten)."""
    if isinstance(module, ZooModel):
        return module.config.kwargs.get("attention") == "circuits" or any(
            isinstance(s.group, HeadPermutation) and s.circuits is not None
            for s in module.symmetry_spec()
        )
    return convertible


def _needs_rewrites(form: Form) -> bool:
    """Whether ``form`` needs rewrites only lmckit's own transformers have."""
    return form.circuits or form.path_circuits or form.rms


def possible_forms(
    module: nn.Module,
    method: str,
    symmetry: str | None,
    head_bases: bool = False,
    convertible: bool = False,
) -> list[str]:
    """The names of the forms of :data:`PREFERRED_FORMS` ``module`` can take, best first
    (forms with circuits need an architecture lmckit can rewrite as circuits; aligning
    bases inside heads leaves the heads as projections)."""
    order = PREFERRED_FORMS.get((method, symmetry), ("projected",))
    possible = _circuits_possible(module, convertible) and not head_bases
    names = [n for n in order if possible or not _needs_rewrites(FORMS[n])]
    return names or ["projected"]


def choose_form(
    module: nn.Module,
    params: Params,
    *,
    method: str = "weight",
    symmetry: str | None = None,
    circuits: bool | None = None,
    head_bases: bool = False,
    convertible: bool = False,
    example_inputs: ExampleInputs | None = None,
) -> FormChoice:
    """The form to align a pair of ``module``'s architecture in (decided, not done).

    Args:
        module, params: the architecture and one model of it (for the orthogonal route).
        method: the aligner's short name (``weight``, ``activation``, ``learned``).
        symmetry: as :func:`aligned_form`.
        circuits: ``True`` / ``False`` force the circuit / projected form; ``None``: the
            first form of :data:`PREFERRED_FORMS` the model can take.
        head_bases: the caller aligns bases inside heads afterwards (projected form only).
        convertible: ``module`` is not a zoo model but can be converted into one (e.g. a
            Hugging Face GPT-2 or ViT folder): forms that need the zoo's rewrites stay
            available, with ``to_zoo`` set.
        example_inputs: inputs for tracing (default: :func:`default_inputs`).

    Raises:
        ValueError: a symmetry or form the architecture cannot have, saying why.
    """
    if symmetry is not None and symmetry not in SYMMETRIES:
        raise ValueError(
            f"symmetry must be one of {', '.join(SYMMETRIES)} or None, got {symmetry!r}"
        )
    if circuits and head_bases:
        raise ValueError("--head-bases aligns bases inside heads; --circuits leaves none")
    zoo = isinstance(module, ZooModel)
    if circuits and zoo and not _circuits_possible(module, convertible):
        raise ValueError(f"--circuits: {type(module).__name__} has no attention heads")
    if circuits and not _circuits_possible(module, convertible):
        raise ValueError(
            f"--circuits rewrites lmckit's own transformers (and Hugging Face GPT-2 and ViT "
            f"folders, converted first); {type(module).__name__} is not one"
        )
    if circuits is None:
        name, chosen = possible_forms(module, method, symmetry, head_bases, convertible)[0], True
    else:
        name, chosen = ("circuits" if circuits else "projected"), False
    form = FORMS[name]
    to_zoo = not zoo and _needs_rewrites(form)
    if symmetry == "orthogonal" and not zoo and not to_zoo:
        # the stream's route to rotations decides whether a zoo rewrite is needed anyway
        spec = spec_of(module, example_inputs)
        if not _has_rotations(spec):
            inputs = example_inputs if example_inputs is not None else default_inputs(module)
            to_zoo = _orthogonal_route(module, params, params, inputs).route == "rmsnorm"
            if to_zoo and not convertible:
                raise _layernorm_error(module)
    return FormChoice(name, symmetry, form.circuits, form.path_circuits, to_zoo, chosen)
