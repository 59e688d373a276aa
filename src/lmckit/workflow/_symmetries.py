"""What lmckit would align in a model: its spaces, groups, and what no symmetry moves.

:func:`describe_symmetries` puts one loaded model in the form ``align`` would
align it in (the same ``symmetry`` and ``circuits`` choices, the same rewrites) and reports
the spec found there, for people (:meth:`SymmetryReport.text`) and as JSON
(:meth:`SymmetryReport.to_dict`). It is the first thing to run on your own model: a
space you expected and do not see, or a large share of parameters that no space moves,
says before any alignment how much alignment can do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lmckit.formats._io import LoadedModel
from lmckit.groups import HeadPermutation, Permutation, PlaneSigns, RotaryPlanes
from lmckit.inference import analyze_symmetries
from lmckit.models import ZooModel
from lmckit.plan._form import choose_model_form, model_form
from lmckit.symmetry._transform import Space, SymmetrySpec

__all__ = ["SpaceSummary", "SymmetryReport", "describe_symmetries"]


@dataclass(frozen=True)
class SpaceSummary:
    """One space of the spec.

    Attributes:
        name: the space's name, e.g. ``"residual"``, ``"heads.0"``.
        group: its group, e.g. ``"Permutation"``, ``"HeadPermutation(4 x 8)"`` (heads x
            head size), ``"Permutation(2 blocks)"`` (whole blocks of units onto blocks).
        n: number of units.
        params: the parameters with an axis in the space, in spec order.
        parent, kind: for a space nested in one unit of another (a head's value basis),
            that space and what the nested space moves (``"value"``, ``"qk"``,
            ``"query"``: the query heads of a key/value group); for a space inside one
            of heads whose order is fixed (no space of their own), those heads.
    """

    name: str
    group: str
    n: int
    params: tuple[str, ...]
    parent: str | None = None
    kind: str | None = None


@dataclass(frozen=True)
class SymmetryReport:
    """The symmetries lmckit aligns a model under (:func:`describe_symmetries`).

    Attributes:
        architecture: the model's class (a Hugging Face class or lmckit's zoo name).
        symmetry: the symmetry asked for (``None``: the architecture's own groups).
        form: what was done to expose it (e.g. ``"norm scales folded"``), empty if nothing.
        spaces: the spec's spaces.
        fixed: parameters that no space moves (aligning leaves them as they are).
        folded: norm scales folded into the layers that read them (now all ones, so
            no symmetry needs to move them; the orthogonal form of RMSNorm models).
        elements: number of parameter elements in the form aligned.
        moved_elements: of those, how many lie in a parameter some space moves or in a
            folded scale.
        left_out: why the graph analysis left axes out (ops it does not understand...).
    """

    architecture: str
    symmetry: str | None
    form: str
    spaces: tuple[SpaceSummary, ...]
    fixed: tuple[str, ...]
    folded: tuple[str, ...]
    elements: int
    moved_elements: int
    left_out: tuple[str, ...]

    def text(self) -> str:
        """The report for people: a table of spaces, then what is fixed and left out."""
        asked = self.symmetry or "the architecture's own groups"
        outer = [s for s in self.spaces if s.parent is None]
        count = f"{len(outer)} space" + ("" if len(outer) == 1 else "s")
        if len(outer) < len(self.spaces):
            count += f" and {len(self.spaces) - len(outer)} nested in their units"
        head = f"{self.architecture}: {count} under {asked}"
        lines = [head + (f" ({self.form})" if self.form else "")]
        rows = _rows(self.spaces)
        width = max([len(r[0]) for r in rows] + [5])
        group_width = max([len(r[1]) for r in rows] + [5])
        lines.append(f"  {'space':<{width}}  {'group':<{group_width}}  {'units':>6}  parameters")
        for name, group, n, params in rows:
            lines.append(f"  {name:<{width}}  {group:<{group_width}}  {n:>6}  {params}")
        share = self.moved_elements / self.elements if self.elements else 0.0
        lines.append(f"parameters some space moves: {share:.1%} of {self.elements:,} elements")
        if self.folded:
            lines.append(f"norm scales folded into the layers that read them: {len(self.folded)}")
        if self.fixed:
            lines.append(f"fixed (no space moves them): {_listed(self.fixed)}")
        if self.left_out:
            lines.append("left out by the graph analysis:")
            lines += [f"  {line}" for line in self.left_out]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, spaces as dicts."""
        return dataclasses.asdict(self)


def _rows(spaces: tuple[SpaceSummary, ...]) -> list[tuple[str, str, int, int]]:
    """Table rows: each space not nested in another, then one row per kind of space
    nested in its units (``value x4``: four spaces, one per unit), indented. Heads whose
    order is fixed get a row of their own (group ``order fixed``) before the spaces
    inside them."""
    rows = []
    names = {s.name for s in spaces}
    fixed: set[str] = set()
    for space in spaces:
        if space.parent is None:
            rows.append((space.name, space.group, space.n, len(space.params)))
            rows += _inner_rows(spaces, space.name)
        elif space.parent not in names and space.parent not in fixed:
            fixed.add(space.parent)
            inner = [s for s in spaces if s.parent == space.parent]
            units = max(len([s for s in inner if s.kind == k]) for k in {s.kind for s in inner})
            rows.append((space.parent, "order fixed", units, 0))
            rows += _inner_rows(spaces, space.parent)
    return rows


def _inner_rows(spaces: tuple[SpaceSummary, ...], parent: str) -> list[tuple[str, str, int, int]]:
    kinds: dict[str, list[SpaceSummary]] = {}
    for inner in (s for s in spaces if s.parent == parent):
        kinds.setdefault(inner.kind or "", []).append(inner)
    rows = []
    for kind, members in kinds.items():
        first = members[0]
        # one space spanning every unit (a scale per unit) is not "one of each"
        label = f"  {kind} x{len(members)}" if len(members) > 1 else f"  {kind}"
        rows.append((label, first.group, first.n, len(first.params)))
    return rows


def _listed(names: tuple[str, ...], most: int = 8) -> str:
    # a model with many layers can have hundreds: the JSON report lists them all
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def _group(space: Space) -> str:
    group = space.group
    if isinstance(group, HeadPermutation):
        return f"{group.name}({group.heads} x {group.head_dim})"
    if isinstance(group, RotaryPlanes | PlaneSigns):
        rotary = str(group.rotary) if group.rotary == space.n else f"{group.rotary} of {space.n}"
        return f"{group.name}({rotary}{', interleaved' if group.interleaved else ''})"
    if isinstance(group, Permutation) and group.blocks > 1:
        # whole blocks onto blocks (GroupNorm's groups, experts routed by groups)
        return f"{group.name}({group.blocks} blocks)"
    return group.name


def _spaces(spec: SymmetrySpec) -> tuple[SpaceSummary, ...]:
    return tuple(
        SpaceSummary(
            s.name,
            _group(s),
            s.n,
            tuple(dict.fromkeys(u.param for u in s.uses)),
            where.parent if (where := s.nest or s.inside) else None,
            where.kind if (where := s.nest or s.inside) else None,
        )
        for s in spec
    )


def describe_symmetries(
    model: LoadedModel, *, symmetry: str | None = None, circuits: bool = False
) -> SymmetryReport:
    """The spec ``align`` would align ``model`` under (:func:`lmckit.plan.plan_alignment`).

    Args:
        model: a loaded model (:func:`lmckit.load_model`: a checkpoint or a Hugging Face
            folder).
        symmetry, circuits: the form, as for ``align`` (:func:`lmckit.forms.aligned_form`).

    Raises:
        ValueError: a symmetry the architecture cannot have, saying why (as ``align``).
    """
    form = model_form(model, choose_model_form(model, symmetry=symmetry, circuits=circuits))
    moved = {u.param for s in form.spec for u in s.uses} | form.folded
    names = form.module.space_names if isinstance(form.module, ZooModel) else None
    # checked, so that spaces the function refuses are listed with why they were left out
    analysis = analyze_symmetries(
        form.module, form.inputs, names=names, params=form.a, uniform=form.folded
    )
    architecture = (
        form.module.config.name if isinstance(form.module, ZooModel) else type(form.module).__name__
    )
    return SymmetryReport(
        architecture=architecture,
        symmetry=symmetry,
        form=form.form,
        spaces=_spaces(form.spec),
        fixed=tuple(k for k in form.a if k not in moved),
        folded=tuple(k for k in form.a if k in form.folded),
        elements=sum(v.numel() for v in form.a.values()),
        moved_elements=sum(v.numel() for k, v in form.a.items() if k in moved),
        left_out=analysis.left_out,
    )
