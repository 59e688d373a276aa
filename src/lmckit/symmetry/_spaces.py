"""Spaces and specs: the data half of the symmetry algebra (:mod:`lmckit.symmetry._transform`).

A :class:`SymmetrySpec` is a tuple of named hidden feature :class:`Space` s, each with a
group and its :class:`Use` s (which parameter axis lives in the space, and whether the
parameter writes into it, reads from it or scales it elementwise), plus the
:class:`Probe` s where activation matching reads it and, for attention heads, the
:class:`HeadCircuits` that weight matching compares. Transforms acting on them live in
:mod:`lmckit.symmetry._transform`, which re-exports everything here.

A use may live in a slice of its parameter (:class:`Part`: one block of a fused
projection, one expert of stacked expert weights, one attention head), and a space may
live inside one unit of a permutation space (:class:`Nest`: the value basis of one
key/value head, the units of one expert). A nested space acts after its parent, in the
parent's output frame: when the parent moves unit ``j`` to position ``i``, whatever the
space at position ``i`` does applies to what came from ``j``. Spaces that share a
parameter axis are therefore ordered (parents first) and either touch disjoint slices of
it or are a parent and its nested spaces; nested spaces of one parent unit that share a
slice act on different factors of it (e.g. the query heads of a group and the basis
inside each of them) and commute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lmckit.groups import Group
from lmckit.groups._base import Role
from lmckit.symmetry._head_circuits import CircuitPart, HeadCircuits
from lmckit.symmetry._space_rules import fit_problems, structural_problems

__all__ = [
    "CircuitPart",
    "HeadCircuits",
    "Nest",
    "Part",
    "Probe",
    "Space",
    "SymmetrySpec",
    "Use",
    "region",
    "with_region",
]


@dataclass(frozen=True)
class Part:
    """A slice of a parameter: ``length`` entries from ``start`` along ``axis``."""

    axis: int
    start: int
    length: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.length < 1:
            raise ValueError(f"a part needs start >= 0 and length >= 1, got {self}")


def region(x: Tensor, parts: tuple[Part, ...]) -> Tensor:
    """``x`` narrowed by each of ``parts`` in turn (a view)."""
    for part in parts:
        x = x.narrow(part.axis % x.ndim, part.start, part.length)
    return x


def with_region(x: Tensor, parts: tuple[Part, ...], new: Tensor) -> Tensor:
    """A copy of ``x`` whose :func:`region` ``parts`` holds ``new`` (functional, so
    gradients flow to both ``x`` and ``new``)."""
    if not parts:
        return new
    first, rest = parts[0], parts[1:]
    axis = first.axis % x.ndim
    inner = with_region(x.narrow(axis, first.start, first.length), rest, new)
    return torch.slice_scatter(x, inner, axis, first.start, first.start + first.length)


@dataclass(frozen=True)
class Use:
    """One parameter axis that lives in a space.

    The axis has size ``outer * n * inner`` and is read as ``(outer, n, inner)``: e.g.
    a fused QKV projection has ``outer = 3``; a linear layer reading a flattened
    ``(channels, height, width)`` map has ``inner = height * width``.

    Attributes:
        param: name of the parameter in the state dict.
        axis: which axis of that parameter.
        role: ``"write"`` if the parameter writes into the space (weights' output axis,
            biases), ``"read"`` if it reads from it, ``"elementwise"`` if it scales or
            shifts each unit separately (norm parameters and statistics), which only
            unit-moving groups (permutations) preserve.
        outer, inner: block layout of the axis around the space's ``n`` units.
        compare: whether weight matching compares the two models on this use. False
            for statistics (BatchNorm running mean and variance): they move with the
            space but measure the data, not the learned function, and their large
            positive values would swamp the similarity.
        parts: the slice of the parameter the use lives in (each part narrows the
            tensor in turn; ``axis``, ``outer`` and ``inner`` refer to the result), e.g.
            the key block of a fused QKV weight or one expert of stacked expert weights.
            Empty: the whole parameter.
    """

    param: str
    axis: int
    role: Role
    outer: int = 1
    inner: int = 1
    compare: bool = True
    parts: tuple[Part, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ("write", "read", "elementwise"):
            raise ValueError(f"role must be 'write', 'read' or 'elementwise', got {self.role!r}")

    def region(self, x: Tensor) -> Tensor:
        """The slice of parameter value ``x`` this use lives in (a view; ``x`` itself
        when the use has no parts)."""
        return region(x, self.parts)

    def region_shape(self, shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
        """The shape of :meth:`region` for a parameter of ``shape``."""
        out = list(shape)
        for part in self.parts:
            if not -len(out) <= part.axis < len(out):
                raise ValueError(f"{self.param!r} of shape {tuple(shape)} has no axis {part.axis}")
            axis = part.axis % len(out)
            if part.start + part.length > out[axis]:
                raise ValueError(
                    f"part {part.start}:{part.start + part.length} of {self.param!r} axis "
                    f"{axis} is outside its size {out[axis]}"
                )
            out[axis] = part.length
        return tuple(out)

    def box(self, shape: tuple[int, ...] | torch.Size) -> tuple[tuple[int, int], ...]:
        """Per axis of the parameter, the ``[start, stop)`` range the use covers."""
        box = [(0, int(size)) for size in shape]
        for part in self.parts:
            axis = part.axis % len(box)
            lo, _ = box[axis]
            box[axis] = (lo + part.start, lo + part.start + part.length)
        return tuple(box)


@dataclass(frozen=True)
class Nest:
    """Where a nested space lives: inside unit ``unit`` of the permutation space
    ``parent`` (for head permutations, a head; for unit permutations, a unit).

    Every unit of the parent holds one space of each ``kind`` (e.g. ``"value"``: the
    value basis of each key/value head); when the parent permutes its units, the nested
    spaces travel with them (:meth:`lmckit.symmetry.Transform.compose`).

    ``unit=None``: one space spans all the parent's units, an entry of its element per
    unit (a scaling of each unit); permuting the parent re-orders the element
    (:meth:`lmckit.groups.Group.reindex`).
    """

    parent: str
    unit: int | None
    kind: str


@dataclass(frozen=True)
class Probe:
    """Where a space's features can be observed: a module's output and its feature axis.

    ``input=True`` observes the module's (first positional) input instead: the input of a
    layer that reads the space holds exactly its features, also where no module outputs
    them (concatenated attention heads, the product of a gated MLP).
    """

    module: str
    axis: int = -1
    input: bool = False


@dataclass(frozen=True)
class Space:
    """A hidden feature space of ``n`` units with a group and the parameters using it.

    ``circuits`` (attention head spaces only) makes weight matching compare heads by
    their QK/OV circuits instead of by the plain weights of the uses. ``nest`` places
    the space inside one unit of a permutation space (see :class:`Nest`). ``within``
    names a space that moves whole units (attention heads) in every unit of which this
    one acts alike (the value basis of the one key/value head every query head reads):
    not nested, it commutes with that space's permutation and shares its axes.
    ``inside`` says where a space lives that is nested in no space: in unit
    ``inside.unit`` of units whose order is fixed (no space of their own: the heads of
    BLOOM, whose ALiBi slopes fix their order), ``inside.parent`` naming them; it acts
    on its unit's slices alone, like any space with parts.
    """

    name: str
    n: int
    group: Group
    uses: tuple[Use, ...]
    probes: tuple[Probe, ...] = ()
    circuits: HeadCircuits | None = None
    nest: Nest | None = None
    within: str | None = None
    inside: Nest | None = None

    @property
    def enclosed(self) -> bool:
        """Whether the space lives inside the units of another (nested in one unit, or
        alike in all, or in one of units whose order is fixed): a basis inside heads,
        not a stream or a set of units."""
        return self.nest is not None or self.within is not None or self.inside is not None

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(u.param for u in self.uses))

    def check_axis(self, use: Use, shape: tuple[int, ...] | torch.Size) -> None:
        """Raise ``ValueError`` unless axis ``use.axis`` of the use's region of a
        parameter of ``shape`` has this space's size."""
        shape = use.region_shape(shape)
        if not -len(shape) <= use.axis < len(shape):
            raise ValueError(f"{use.param!r} of shape {tuple(shape)} has no axis {use.axis}")
        want = use.outer * self.n * use.inner
        if shape[use.axis] != want:
            raise ValueError(
                f"space {self.name!r} (n={self.n}) expects axis {use.axis} of "
                f"{use.param!r} to have size {want}, found {shape[use.axis]}"
            )


@dataclass(frozen=True)
class SymmetrySpec:
    """The symmetry structure of one architecture: a tuple of named spaces.

    A spec is data; build it once per architecture. ``validate(params)`` checks that
    it fits a parameter set.
    """

    spaces: tuple[Space, ...]
    meta: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = structural_problems(self.spaces)
        if problems:
            raise ValueError(problems[0][1])

    def nested_in(self, parent: str) -> list[Space]:
        """The spaces nested directly in space ``parent`` (in spec order)."""
        return [s for s in self.spaces if s.nest is not None and s.nest.parent == parent]

    def family(self, parent: str, kind: str) -> list[Space]:
        """The spaces of ``kind`` nested in ``parent``, indexed by the parent's unit."""
        members = [s for s in self.nested_in(parent) if s.nest is not None and s.nest.kind == kind]
        return sorted(members, key=lambda s: s.nest.unit or 0 if s.nest is not None else 0)

    def __getitem__(self, name: str) -> Space:
        for space in self.spaces:
            if space.name == name:
                return space
        raise KeyError(f"no space {name!r}; spaces are {[s.name for s in self.spaces]}")

    def __iter__(self) -> Iterator[Space]:
        return iter(self.spaces)

    def __len__(self) -> int:
        return len(self.spaces)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.spaces)

    def uses_of(self, param: str) -> list[tuple[Space, Use]]:
        """All (space, use) pairs that touch ``param``."""
        return [(s, u) for s in self.spaces for u in s.uses if u.param == param]

    def with_groups(self, **groups: Group) -> SymmetrySpec:
        """Copy with some spaces' groups replaced, e.g. ``with_groups(residual=Orthogonal())``."""
        unknown = set(groups) - set(self.names)
        if unknown:
            raise KeyError(f"no spaces named {sorted(unknown)}")
        spaces = tuple(
            dataclasses.replace(s, group=groups[s.name]) if s.name in groups else s
            for s in self.spaces
        )
        return SymmetrySpec(spaces, self.meta)

    def validate(self, params: Mapping[str, Tensor]) -> None:
        """Raise ``ValueError`` naming the first use that does not fit ``params``."""
        problems = fit_problems(self.spaces, params)
        if problems:
            raise ValueError(problems[0][1])
