"""Which form a pair is aligned in and measured on, decided as data.

A *form* (:data:`FORMS`) says whether attention heads are aligned as their projections
or as QK/OV circuits, whether paths interpolate heads as circuits, and whether
permutations act on a LayerNorm stream's RMSNorm form. :data:`PREFERRED_FORMS` orders
them, best first, per method and symmetry (measured on CPU-trained GPT-2 pairs,
``docs/experiments/reference_comparison.md``); :func:`choose_form` picks the first a
model can take, and :class:`FormChoice` is what an aligned model records so that
``barrier`` and ``merge`` measure it in the same form. :func:`lmckit.forms.aligned_form`
puts two models in a form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from lmckit._errors import Param, ParameterError, Worded, worded
from lmckit.forms._recipe import SYMMETRIES, check_symmetry
from lmckit.groups import HeadPermutation
from lmckit.models import ZooModel
from lmckit.outputs import OutputKind

__all__ = [
    "FORMS",
    "PREFERRED_FORMS",
    "Form",
    "FormChoice",
    "check_heads_request",
    "choose_form",
    "point_has_circuits",
    "possible_forms",
    "written_kind",
]


@dataclass(frozen=True)
class Form:
    """A form a pair can be aligned in, and the path it is measured on.

    Attributes:
        circuits: attention heads are rewritten as QK/OV circuits before aligning.
        path_circuits: paths and merges interpolate heads as circuits (the ends are the
            same functions either way; the points between them differ).
        rms: permutations of a LayerNorm stream act on its RMSNorm form (see
            :func:`lmckit.forms.aligned_form`'s ``rms``), where it is also interpolated.
        label: how the form is named to people (``"projected, circuit path"``).
        what: what the form does, in a phrase.
    """

    circuits: bool
    path_circuits: bool
    rms: bool = False
    label: str = ""
    what: str = ""

    @property
    def rewrites(self) -> bool:
        """Whether the form needs rewrites only lmckit's own transformers have."""
        return self.circuits or self.path_circuits or self.rms


#: The forms :func:`choose_form` picks from, by identifier (what records hold).
FORMS: dict[str, Form] = {
    "projected": Form(False, False, label="projected", what="attention heads as their projections"),
    "circuits": Form(
        True,
        True,
        label="circuits",
        what="attention heads as QK/OV circuits, aligned and interpolated in that form",
    ),
    # heads aligned as their projections, interpolated as circuits (as the paper's code)
    "circuit_path": Form(
        False,
        True,
        label="projected, circuit path",
        what="attention heads aligned as their projections and interpolated as QK/OV circuits",
    ),
    "circuits_rms": Form(
        True,
        True,
        rms=True,
        label="circuits, RMSNorm form",
        what="attention heads as QK/OV circuits, the residual stream permuted and "
        "interpolated in its RMSNorm form",
    ),
}

#: Names of the forms in records written before the forms had identifiers.
_RECORDED_LABELS = {f.label: name for name, f in FORMS.items()}

#: Default forms, best first, by ``(method, symmetry)``: the first form a model can take
#: is the default (a pair without attention heads, or one whose class lmckit cannot
#: rewrite as circuits, falls through to ``"projected"``). Measured: lowest test-loss
#: barrier on CPU-trained GPT-2 pairs (``docs/experiments/reference_comparison.md``);
#: a new form or a new measurement is a change of this table only.
PREFERRED_FORMS: dict[tuple[str, str | None], tuple[str, ...]] = {
    ("weight", "orthogonal"): ("circuits", "circuit_path", "projected"),
    ("weight", "permutation"): ("circuits", "circuit_path", "circuits_rms", "projected"),
    ("weight", None): ("circuits", "circuit_path", "projected"),
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

    @property
    def form(self) -> Form:
        """The form's entry in :data:`FORMS`."""
        return FORMS[self.name]

    def described(self) -> Worded:
        """One line for the user: the form and how to get the other (parameters named
        as :mod:`lmckit._errors` words them)."""
        how = "the best measured for this method and symmetry" if self.chosen else "as asked"
        line = f"form: {self.form.label} ({self.form.what}; {how})"
        if not (self.circuits and self.chosen):
            return worded(line.replace("{", "{{").replace("}", "}}"))
        return worded(line + " ({circuits} for the projected form)",
                      circuits=Param("circuits", False))  # fmt: skip

    def describe(self) -> str:
        """:meth:`described` in Python's words."""
        return str(self.described())

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
        """The choice :meth:`to_dict` wrote (or an earlier version, which named the forms
        by their labels), or ``None`` for anything else."""
        if not isinstance(data, dict):
            return None
        name = _RECORDED_LABELS.get(data.get("name"), data.get("name"))  # type: ignore[arg-type]
        if name not in FORMS:
            return None
        symmetry = data.get("symmetry")
        if symmetry is not None and symmetry not in SYMMETRIES:
            return None
        flags = [data.get(k) for k in ("circuits", "path_circuits", "to_zoo", "chosen")]
        if not all(isinstance(f, bool) for f in flags):
            return None
        circuits, path_circuits, to_zoo, chosen = (bool(f) for f in flags)
        return cls(name, symmetry, circuits, path_circuits, to_zoo, chosen)


def check_heads_request(circuits: bool | None, head_bases: bool) -> None:
    """Refuse aligning the bases inside heads together with the circuit form, which
    leaves no bases inside heads: the one check of the two together.

    Raises:
        ParameterError: both asked for.
    """
    if circuits and head_bases:
        raise ParameterError(
            "{head_bases} aligns bases inside heads; {circuits} leaves none",
            head_bases=Param("head_bases", True),
            circuits=Param("circuits", True),
        )


def point_has_circuits(choice: FormChoice | None, circuits: bool | None = None) -> bool:
    """Whether a point of a path between two models (a merged model) has its heads as
    QK/OV circuits: the recorded form ``choice`` aligns them as circuits, or the path
    interpolates them as circuits (``circuits``, else as ``choice`` records)."""
    if circuits:
        return True
    return choice is not None and (choice.circuits or (circuits is None and choice.path_circuits))


def written_kind(kind: OutputKind, *, circuit_heads: bool = False) -> OutputKind:
    """The one decision of what a result is written as: a model of output kind ``kind``
    stays that kind (B aligned in lmckit's form is lifted back into its class:
    :mod:`lmckit.plan._lift`), unless its heads are QK/OV circuits between two models'
    (a merged point, :func:`point_has_circuits`), which no class of projected heads
    holds: an lmckit checkpoint."""
    return "checkpoint" if circuit_heads else kind


def _circuits_possible(module: nn.Module, convertible: bool) -> bool:
    """Whether the circuit rewrite applies: a zoo transformer, or a model convertible
    into one (its heads are checked when it is rewritten)."""
    if isinstance(module, ZooModel):
        return module.config.kwargs.get("attention") == "circuits" or any(
            isinstance(s.group, HeadPermutation) and s.circuits is not None
            for s in module.symmetry_spec()
        )
    return convertible


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
    names = [n for n in order if possible or not FORMS[n].rewrites]
    return names or ["projected"]


def choose_form(
    module: nn.Module,
    *,
    method: str = "weight",
    symmetry: str | None = None,
    circuits: bool | None = None,
    head_bases: bool = False,
    convertible: bool = False,
) -> FormChoice:
    """The form to align a pair of ``module``'s architecture in (decided, not done).

    Args:
        module: the architecture.
        method: the aligner's short name (``weight``, ``activation``, ``learned``).
        symmetry: as :func:`lmckit.forms.aligned_form`.
        circuits: ``True`` / ``False`` force the circuit / projected form; ``None``: the
            first form of :data:`PREFERRED_FORMS` the model can take.
        head_bases: the caller aligns bases inside heads afterwards (projected form only).
        convertible: ``module`` is not a zoo model but can be converted into one (e.g. a
            Hugging Face GPT-2 or ViT folder): forms that need the zoo's rewrites stay
            available, with ``to_zoo`` set.

    Raises:
        ValueError: a symmetry or form the architecture cannot have, saying why.
    """
    check_symmetry(symmetry)
    check_heads_request(circuits, head_bases)
    zoo = isinstance(module, ZooModel)
    if circuits and zoo and not _circuits_possible(module, convertible):
        raise ValueError(
            f"the circuit form rewrites attention heads as QK/OV circuits; "
            f"{type(module).__name__} has no attention heads"
        )
    if circuits and not _circuits_possible(module, convertible):
        raise ValueError(
            f"the circuit form rewrites lmckit's own transformers (and Hugging Face GPT-2 and "
            f"ViT folders, converted first); {type(module).__name__} is not one"
        )
    if circuits is None:
        name, chosen = possible_forms(module, method, symmetry, head_bases, convertible)[0], True
    else:
        name, chosen = ("circuits" if circuits else "projected"), False
    form = FORMS[name]
    to_zoo = not zoo and form.rewrites
    # whether the stream admits rotations (and how) is decided by the aligned form
    # itself (lmckit.forms._recipe.orthogonal_route), which refuses a model with no route in one
    # line before any alignment: deciding it here too would trace and check the model
    # twice more
    return FormChoice(name, symmetry, form.circuits, form.path_circuits, to_zoo, chosen)
