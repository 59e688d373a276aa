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
:mod:`lmckit.groups` (one module each), spaces and specs in :mod:`lmckit.symmetry._spaces`; both
are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from lmckit.groups import (
    CenteredOrthogonal,
    Group,
    HeadPermutation,
    Invertible,
    Orthogonal,
    PaddedPermutation,
    Permutation,
    SemiPermutation,
)
from lmckit.groups._padded_permutation import PaddedPermutationElement
from lmckit.groups._semi_permutation import SemiPermutationElement
from lmckit.symmetry._params import LazyParams, Params, as_params, layout, meta_of, stored_dtype
from lmckit.symmetry._spaces import (
    CircuitPart,
    HeadCircuits,
    Nest,
    Part,
    Probe,
    Space,
    SymmetrySpec,
    Use,
)

__all__ = [
    "CircuitPart",
    "Group",
    "HeadCircuits",
    "HeadPermutation",
    "Invertible",
    "MovedParams",
    "Nest",
    "CenteredOrthogonal",
    "Orthogonal",
    "PaddedPermutation",
    "PaddedPermutationElement",
    "Part",
    "Permutation",
    "Probe",
    "SemiPermutation",
    "SemiPermutationElement",
    "Space",
    "SymmetrySpec",
    "Transform",
    "Use",
    "act_on_axis",
    "apply",
    "as_spec",
    "as_transform",
    "check_transform",
]


# --------------------------------------------------------------------------- arguments


def as_spec(value: object, what: str = "spec") -> SymmetrySpec:
    """``value`` if it is a :class:`SymmetrySpec`, else a one-line ``TypeError`` saying
    where a spec comes from."""
    if isinstance(value, SymmetrySpec):
        return value
    raise TypeError(
        f"{what} must be a SymmetrySpec (a zoo model's .symmetry_spec(), or "
        f"lmckit.infer_spec(module, inputs)), got {type(value).__name__}"
    )


def as_transform(spec: SymmetrySpec, value: object) -> Transform:
    """``value`` as a :class:`Transform` of ``spec``: a transform, or a dict of group
    elements by space name (e.g. ``{"hidden.0": torch.randperm(6)}``).

    Raises:
        TypeError: anything else (an alignment result: pass its ``.transform``).
        KeyError: a dict naming a space the spec does not have.
    """
    if isinstance(value, Transform):
        return value
    if isinstance(value, Mapping):
        return Transform(spec, dict(value))
    hint = (
        ": pass its .transform" if isinstance(getattr(value, "transform", None), Transform) else ""
    )
    raise TypeError(
        f"transform must be a Transform or a dict of group elements by space name, got "
        f"{type(value).__name__}{hint}"
    )


# --------------------------------------------------------------------------- transforms


@dataclass(frozen=True)
class Transform:
    """One group element per space of a spec (spaces left out act as the identity)."""

    spec: SymmetrySpec
    elements: Mapping[str, object]

    def __post_init__(self) -> None:
        as_spec(self.spec)
        if not isinstance(self.elements, Mapping):
            raise TypeError(
                f"elements must be a dict of group elements by space name, got "
                f"{type(self.elements).__name__}"
            )
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
        """``self ∘ first``: apply ``first``, then ``self``.

        A nested space acts after its parent, at the parent's output position; so the
        composite's space at unit ``i`` of a parent follows ``self``'s element there by
        ``first``'s element at the unit ``self``'s parent moved to ``i``
        (:class:`~lmckit.symmetry.Nest`).
        """
        elements = {}
        for space in self.spec:
            source = self._carried(space, self)
            earlier = first.elements.get(source)
            if earlier is not None and space.nest is not None and space.nest.unit is None:
                index = self.spec[space.nest.parent].group.unit_index(self[space.nest.parent])
                earlier = space.group.reindex(earlier, index)
            if space.name not in self.elements:  # identity second: no product to form
                if earlier is not None:
                    elements[space.name] = earlier
            elif earlier is None:
                elements[space.name] = self.elements[space.name]
            else:
                elements[space.name] = space.group.compose(self.elements[space.name], earlier)
        return Transform(self.spec, elements)

    def inverse(self) -> Transform:
        """The transform undoing this one (nested elements re-indexed by the inverse of
        their parent's permutation)."""
        inverse = Transform(self.spec, {})
        elements = {}
        for space in self.spec:
            # (C P)^-1 = P^-1 C^-1: the nested inverse sits where P^-1 moves its unit
            source = self._carried(space, inverse, parents=self)
            element = space.group.inverse(self[source])
            if space.nest is not None and space.nest.unit is None:
                index = self.spec[space.nest.parent].group.unit_index(self[space.nest.parent])
                element = space.group.reindex(element, torch.argsort(index.cpu()))
            elements[space.name] = element
        return Transform(self.spec, elements)

    def _carried(self, space: Space, mover: Transform, *, parents: Transform | None = None) -> str:
        """The name of the space of ``space``'s kind at the unit that ``mover``'s parent
        element moves to ``space``'s unit (``space`` itself for unnested spaces).

        For :meth:`inverse`, ``parents`` holds the elements whose parents are inverted.
        """
        nest = space.nest
        if nest is None or nest.unit is None:
            return space.name
        parent = self.spec[nest.parent]
        if parents is not None:
            index = parent.group.unit_index(parents[nest.parent])
            source = int(torch.argsort(index.cpu())[nest.unit])
        else:
            source = int(parent.group.unit_index(mover[nest.parent]).cpu()[nest.unit])
        return self.spec.family(nest.parent, nest.kind)[source].name

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
    skip_use: tuple[str, Use] | None = None,
    uses: Sequence[tuple[Space, Use]] | None = None,
) -> Tensor:
    """Apply ``transform`` to one parameter; ``skip`` leaves one space out, ``skip_use``
    one ``(space name, use)`` (a space may act on several axes of one parameter, e.g. a
    QK circuit; equal uses of different spaces, a unit space and a scaling nested in it,
    stay apart); ``uses`` (default: every use of the parameter) only those.

    Spaces act in spec order (a nested space after its parent). A use that lives in a
    slice of the parameter (:class:`~lmckit.symmetry.Part`) acts on that slice of a private
    copy; ``value`` is never modified.
    """
    out = value
    owned = False
    for space, use in spec.uses_of(name) if uses is None else uses:
        skipped = space.name == skip or (space.name, use) == skip_use
        if skipped or space.name not in transform.elements:
            continue
        element = transform.elements[space.name]
        if use.parts:
            if not owned:
                out, owned = out.clone(), True
            region = use.region(out)
            region.copy_(_act_on_use(region, use, space, element))
        else:
            out, owned = _act_on_use(out, use, space, element), True
    return out


def _act_on_use(x: Tensor, use: Use, space: Space, element: object) -> Tensor:
    """``x`` (a parameter or its use's region) moved by ``element`` along the use's axis.

    Groups that only gather (permutations) index the axis in place, and groups that
    scale each unit multiply along it: neither moves the axis to the front (a transposed
    copy of a large weight, both ways, for every space).
    """
    group = space.group
    axis = use.axis % x.ndim
    if group.gathers:
        positions = torch.arange(x.shape[axis], device=x.device)
        flat = Use(use.param, 0, use.role, use.outer, use.inner)
        act = partial(group.act, element=element, role=use.role)
        return x.index_select(axis, act_on_axis(positions, flat, space.n, act))
    factors = group.unit_factors(element, use.role)
    if factors is not None:
        along = factors.to(device=x.device, dtype=x.dtype).repeat_interleave(use.inner)
        shape = [1] * x.ndim
        shape[axis] = -1
        return x * along.repeat(use.outer).reshape(shape)
    act = partial(group.act, element=element, role=use.role)
    return act_on_axis(x, use, space.n, act)


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
            space.check_axis(use, value.shape)


def apply(
    spec: SymmetrySpec, params: Mapping[str, Tensor], transform: Transform | Mapping[str, object]
) -> Params:
    """Return new params with ``transform`` applied; ``params`` is not modified.

    The transform is checked first (:func:`check_transform`): an element of the wrong
    size or outside its group is a ``ValueError`` naming the space, never a silently
    corrupted model. Parameters that no space uses are passed through (same tensor
    objects). Integer tensors (e.g. BatchNorm's ``num_batches_tracked``) are never
    transformed. Each parameter keeps its dtype; a bfloat16 or float16 one is moved in
    float32 and rounded once, unless only permutations move it (they gather entries,
    exactly, in the parameter's own dtype). Of a :class:`~lmckit.symmetry._params.LazyParams`
    (a model with folded norm scales) each tensor is read once and kept in the dtype
    it is stored in.

    Args:
        spec: the architecture's spec.
        params: the weights (a state dict).
        transform: a :class:`Transform` of ``spec``, or a dict of group elements by space
            name (spaces left out stay put).

    Raises:
        TypeError: arguments of the wrong kind (a checkpoint for ``params``, ...), named.
        ValueError: an element that does not fit its space (see above).
    """
    moved = MovedParams(spec, params, transform)
    return {name: moved[name] for name in moved}


class MovedParams(LazyParams):
    """``params`` moved by ``transform``, each tensor computed when read, exactly as
    :func:`apply` computes it (checked the same way, when made): a model to write or
    read once costs one tensor at a time, not a second model."""

    def __init__(
        self,
        spec: SymmetrySpec,
        params: Mapping[str, Tensor],
        transform: Transform | Mapping[str, object],
    ) -> None:
        super().__init__(as_params(params))
        self.spec = as_spec(spec)
        self.transform = as_transform(self.spec, transform)
        check_transform(self.spec, layout(self.source), self.transform)
        self._acting: dict[str, list[Space]] = {}
        for s in self.spec:
            for u in s.uses:
                self._acting.setdefault(u.param, []).append(s)

    def __getitem__(self, name: str) -> Tensor:
        value = self.source[name]
        if not value.is_floating_point():
            return value
        keep = stored_dtype(self.source, name)
        spaces = self._acting.get(name, [])
        if not spaces:
            return value.to(keep)
        if all(s.group.gathers for s in spaces):
            # permutations only gather entries: exact in any dtype, no wider copy
            return apply_to_param(self.spec, name, value, self.transform).to(keep)
        # computed in float32 at least, rounded once to the parameter's own dtype (a
        # rotation applied in bfloat16 would round the rotation first)
        wide = value.to(torch.promote_types(value.dtype, torch.float32))
        return apply_to_param(self.spec, name, wide, self.transform).to(keep)

    def dtype_of(self, key: str) -> torch.dtype:
        return stored_dtype(self.source, key)

    def meta(self, key: str) -> Tensor:
        return meta_of(self.source, key).to(self.dtype_of(key))
