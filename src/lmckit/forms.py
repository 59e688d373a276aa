"""Which form a pair is aligned in and measured on, decided as data.

A *form* (:data:`FORMS`) says whether attention heads are aligned as their projections
or as QK/OV circuits, whether paths interpolate heads as circuits, and whether
permutations act on a LayerNorm stream's RMSNorm form. :data:`PREFERRED_FORMS` orders
them, best first, per method and symmetry (measured on CPU-trained GPT-2 pairs,
``docs/experiments/reference_comparison.md``); :func:`choose_form` picks the first a
model can take, and :class:`FormChoice` is what an aligned model records so that
``barrier`` and ``merge`` measure it in the same form. :func:`lmckit.recipe.aligned_form`
puts two models in a form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from lmckit.groups import HeadPermutation
from lmckit.models import ZooModel
from lmckit.recipe import SYMMETRIES

__all__ = [
    "FORMS",
    "PREFERRED_FORMS",
    "Form",
    "FormChoice",
    "choose_form",
    "possible_forms",
]


@dataclass(frozen=True)
class Form:
    """A form a pair can be aligned in, and the path it is measured on.

    Attributes:
        circuits: attention heads are rewritten as QK/OV circuits before aligning.
        path_circuits: paths and merges interpolate heads as circuits (the ends are the
            same functions either way; the points between them differ).
        rms: permutations of a LayerNorm stream act on its RMSNorm form (see
            :func:`lmckit.recipe.aligned_form`'s ``rms``), where it is also interpolated.
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
        symmetry: as :func:`lmckit.recipe.aligned_form`.
        circuits: ``True`` / ``False`` force the circuit / projected form; ``None``: the
            first form of :data:`PREFERRED_FORMS` the model can take.
        head_bases: the caller aligns bases inside heads afterwards (projected form only).
        convertible: ``module`` is not a zoo model but can be converted into one (e.g. a
            Hugging Face GPT-2 or ViT folder): forms that need the zoo's rewrites stay
            available, with ``to_zoo`` set.

    Raises:
        ValueError: a symmetry or form the architecture cannot have, saying why.
    """
    if symmetry is not None and symmetry not in SYMMETRIES:
        raise ValueError(
            f"symmetry must be one of {', '.join(SYMMETRIES)} or None, got {symmetry!r}"
        )
    if circuits and head_bases:
        raise ValueError("head_bases=True aligns bases inside heads; circuits=True leaves none")
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
    to_zoo = not zoo and _needs_rewrites(form)
    # whether the stream admits rotations (and how) is decided by the aligned form
    # itself (lmckit.recipe.orthogonal_route), which refuses a model with no route in one
    # line before any alignment: deciding it here too would trace and check the model
    # twice more
    return FormChoice(name, symmetry, form.circuits, form.path_circuits, to_zoo, chosen)
