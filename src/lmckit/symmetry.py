"""Symmetry algebra: groups, spaces, specs and transforms.

A :class:`SymmetrySpec` describes the parameter symmetries of one architecture as
data: a set of named hidden feature *spaces*, each with a *group* and a list of
*uses* (which parameter axis lives in the space, and whether the parameter writes
into the space or reads from it).

A :class:`Transform` holds one group element per space. For an element ``T`` of a
space, a hidden vector moves as ``h' = T h``; a writer ``W`` (``h = W x``) becomes
``T W`` and a reader ``R`` (``y = R h``) becomes ``R T^{-1}``, i.e. along the
reader's axis it is contracted with ``T^{-T}``. For permutations and orthogonal maps
``T^{-T} = T``. Rectangular elements (semi-permutations and orthogonal maps with
orthonormal columns, ``m x n`` with ``m >= n``) embed a narrow space into a wider
one; readers then use a left inverse ``L`` with ``L T = I``.

Applying any element of a spec's groups leaves the network's function unchanged:
that invariant is tested for every model in the zoo. The groups themselves live in
:mod:`lmckit.groups` (one module each) and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor

from lmckit.groups import (
    Group,
    HeadPermutation,
    Invertible,
    Orthogonal,
    PaddedPermutation,
    PaddedPermutationElement,
    Permutation,
    Role,
    SemiPermutation,
    SemiPermutationElement,
)
from lmckit.params import Params

__all__ = [
    "CircuitPart",
    "Group",
    "HeadCircuits",
    "HeadPermutation",
    "Invertible",
    "Orthogonal",
    "PaddedPermutation",
    "PaddedPermutationElement",
    "Permutation",
    "SemiPermutation",
    "SemiPermutationElement",
    "Space",
    "SymmetrySpec",
    "Transform",
    "Use",
    "act_on_axis",
    "apply",
    "check_transform",
    "random_transform",
]


# --------------------------------------------------------------------------- spaces


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
    """

    param: str
    axis: int
    role: Role
    outer: int = 1
    inner: int = 1
    compare: bool = True

    def __post_init__(self) -> None:
        if self.role not in ("write", "read", "elementwise"):
            raise ValueError(f"role must be 'write', 'read' or 'elementwise', got {self.role!r}")


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
class CircuitPart:
    """Rows of a parameter that hold one attention projection (Q, K or V) of every head.

    Axis 0 of ``param`` is read as ``blocks`` blocks of ``n`` rows and block ``block``
    is the projection, e.g. ``CircuitPart("attn.c_attn.weight", 1, 3)`` for the keys of
    a fused ``(3 n, d)`` QKV weight.
    """

    param: str
    block: int = 0
    blocks: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.block < self.blocks:
            raise ValueError(f"block {self.block} out of range for {self.blocks} blocks")


@dataclass(frozen=True)
class HeadCircuits:
    """Where a head space's QK and OV circuits live (bias-augmented).

    For head ``h`` with query rows ``Q_h = [W_q,h | b_q,h]`` (``(head_dim, d + 1)``)
    and keys ``K_h`` alike, the QK circuit is ``Q_h^T K_h``; with values ``V_h`` and
    the output columns ``O_h`` (``(d_out, head_dim)``) of ``output``, the OV circuit
    is ``O_h V_h``. Heads are matched on these, see :mod:`lmckit.align.circuits`.
    """

    query: CircuitPart
    key: CircuitPart
    value: CircuitPart
    output: str
    query_bias: CircuitPart | None = None
    key_bias: CircuitPart | None = None
    value_bias: CircuitPart | None = None


@dataclass(frozen=True)
class Space:
    """A hidden feature space of ``n`` units with a group and the parameters using it.

    ``circuits`` (attention head spaces only) makes weight matching compare heads by
    their QK/OV circuits instead of by the plain weights of the uses.
    """

    name: str
    n: int
    group: Group
    uses: tuple[Use, ...]
    probes: tuple[Probe, ...] = ()
    circuits: HeadCircuits | None = None

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(u.param for u in self.uses))


@dataclass(frozen=True)
class SymmetrySpec:
    """The symmetry structure of one architecture: a tuple of named spaces.

    A spec is data; build it once per architecture. ``validate(params)`` checks that
    it fits a parameter set.
    """

    spaces: tuple[Space, ...]
    meta: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [s.name for s in self.spaces]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate space names: {sorted(dupes)}")
        seen: dict[tuple[str, int], str] = {}
        for space in self.spaces:
            if not space.uses:
                raise ValueError(f"space {space.name!r} has no uses")
            for use in space.uses:
                key = (use.param, use.axis)
                if key in seen:
                    raise ValueError(
                        f"axis {use.axis} of {use.param!r} is used by both "
                        f"{seen[key]!r} and {space.name!r}"
                    )
                seen[key] = space.name

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
        for space in self.spaces:
            for use in space.uses:
                if use.param not in params:
                    raise ValueError(f"space {space.name!r} uses missing parameter {use.param!r}")
                _check_axis(space, use, params[use.param].shape)
                if use.role == "elementwise" and not space.group.elementwise_ok:
                    raise ValueError(
                        f"{type(space.group).__name__} space {space.name!r} cannot act on "
                        f"elementwise parameter {use.param!r}"
                    )


# --------------------------------------------------------------------------- transforms


@dataclass(frozen=True)
class Transform:
    """One group element per space of a spec (spaces left out act as the identity)."""

    spec: SymmetrySpec
    elements: Mapping[str, object]

    def __post_init__(self) -> None:
        unknown = set(self.elements) - set(self.spec.names)
        if unknown:
            raise KeyError(f"transform names unknown spaces {sorted(unknown)}")

    @classmethod
    def identity(cls, spec: SymmetrySpec) -> Transform:
        return cls(spec, {s.name: s.group.identity(s.n) for s in spec})

    def __getitem__(self, name: str) -> object:
        if name in self.elements:
            return self.elements[name]
        space = self.spec[name]
        return space.group.identity(space.n)

    def compose(self, first: Transform) -> Transform:
        """``self ∘ first``: apply ``first``, then ``self``."""
        elements = {}
        for space in self.spec:
            elements[space.name] = space.group.compose(self[space.name], first[space.name])
        return Transform(self.spec, elements)

    def inverse(self) -> Transform:
        return Transform(self.spec, {s.name: s.group.inverse(self[s.name]) for s in self.spec})

    def replace(self, **elements: object) -> Transform:
        return Transform(self.spec, {**self.elements, **elements})


def act_on_axis(x: Tensor, use: Use, n: int, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """``x`` with ``fn`` applied to the use's axis viewed as ``(outer, n, inner)``.

    ``fn`` maps ``(outer, n, k)`` to ``(outer, m, k)`` (``k`` gathers the inner block
    and every other axis); the result has the axis resized to ``outer * m * inner``.
    """
    axis = use.axis % x.ndim
    moved = x.movedim(axis, 0)
    rest = moved.shape[1:]
    out = fn(moved.reshape(use.outer, n, use.inner * math.prod(rest)))
    return out.reshape(use.outer * out.shape[1] * use.inner, *rest).movedim(0, axis)


def apply_to_param(
    spec: SymmetrySpec,
    name: str,
    value: Tensor,
    transform: Transform,
    *,
    skip: str | None = None,
    skip_use: Use | None = None,
) -> Tensor:
    """Apply ``transform`` to one parameter; ``skip`` leaves one space out, ``skip_use``
    one axis (a space may act on several axes of one parameter, e.g. a QK circuit)."""
    out = value
    for space, use in spec.uses_of(name):
        if space.name == skip or use == skip_use or space.name not in transform.elements:
            continue
        element = transform.elements[space.name]
        out = act_on_axis(
            out, use, space.n, partial(space.group.act, element=element, role=use.role)
        )
    return out


def check_transform(spec: SymmetrySpec, params: Mapping[str, Tensor], transform: Transform) -> None:
    """Raise a one-line ``ValueError`` unless ``transform`` can act on ``params``.

    Checks that the transform was made for ``spec`` (same space names), that every
    element belongs to its space's group and acts on the space's ``n`` units
    (:meth:`~lmckit.groups.Group.validate`: linear time for unit-moving groups, one
    ``O^T O`` for orthogonal maps), and that every axis of ``params`` a space uses has
    the size the spec expects.
    """
    if transform.spec is not spec and transform.spec.names != spec.names:
        raise ValueError("transform was made for a different spec")
    for space in spec:
        if space.name not in transform.elements:
            continue
        try:
            space.group.validate(transform.elements[space.name], space.n)
        except ValueError as err:
            raise ValueError(f"transform for space {space.name!r}: {err}") from None
    for space in spec:
        for use in space.uses:
            value = params.get(use.param)
            if value is None or not value.is_floating_point():
                continue
            _check_axis(space, use, value.shape)


def _check_axis(space: Space, use: Use, shape: torch.Size) -> None:
    if not -len(shape) <= use.axis < len(shape):
        raise ValueError(f"{use.param!r} of shape {tuple(shape)} has no axis {use.axis}")
    want = use.outer * space.n * use.inner
    if shape[use.axis] != want:
        raise ValueError(
            f"space {space.name!r} (n={space.n}) expects axis {use.axis} of "
            f"{use.param!r} to have size {want}, found {shape[use.axis]}"
        )


def apply(spec: SymmetrySpec, params: Params, transform: Transform) -> Params:
    """Return new params with ``transform`` applied; ``params`` is not modified.

    The transform is checked first (:func:`check_transform`): an element of the wrong
    size or outside its group is a ``ValueError`` naming the space, never a silently
    corrupted model. Parameters that no space uses are passed through (same tensor
    objects). Integer tensors (e.g. BatchNorm's ``num_batches_tracked``) are never
    transformed.
    """
    check_transform(spec, params, transform)
    touched = {u.param for s in spec for u in s.uses}
    out: dict[str, Tensor] = {}
    for name, value in params.items():
        if name in touched and value.is_floating_point():
            out[name] = apply_to_param(spec, name, value, transform)
        else:
            out[name] = value
    return out


def random_transform(
    spec: SymmetrySpec,
    seed: int | torch.Generator,
    *,
    widths: Mapping[str, int] | None = None,
) -> Transform:
    """Draw a random element of every space.

    Args:
        spec: the spec.
        seed: an integer seed or a ``torch.Generator``.
        widths: for rectangular groups, target sizes ``m`` per space (default ``n``).
    """
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    widths = dict(widths or {})
    elements = {}
    for space in spec:
        m = widths.pop(space.name, None)
        elements[space.name] = space.group.random(space.n, gen, m=m)
    if widths:
        raise KeyError(f"widths name unknown spaces {sorted(widths)}")
    return Transform(spec, elements)


def distance_to_identity(spec: SymmetrySpec, transform: Transform) -> dict[str, float]:
    """Per space: Frobenius distance of the element's matrix to the identity, over ``sqrt(n)``."""
    out = {}
    for space in spec:
        mat = space.group.matrix(transform[space.name])
        if mat.shape[0] != mat.shape[1]:
            out[space.name] = float("nan")
            continue
        eye = torch.eye(mat.shape[0], dtype=mat.dtype)
        out[space.name] = float(torch.linalg.norm(mat - eye) / math.sqrt(mat.shape[0]))
    return out
