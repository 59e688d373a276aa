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
that invariant is tested for every model in the zoo.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from lmckit.params import Params

Role = Literal["write", "read", "elementwise"]

__all__ = [
    "CircuitPart",
    "Group",
    "HeadCircuits",
    "HeadPermutation",
    "Invertible",
    "Orthogonal",
    "Permutation",
    "SemiPermutation",
    "SemiPermutationElement",
    "Space",
    "SymmetrySpec",
    "Transform",
    "Use",
    "apply",
    "random_transform",
]


# --------------------------------------------------------------------------- groups


class Group:
    """A group (or, for rectangular maps, a set of embeddings) acting on a space.

    Elements are plain tensors (or :class:`SemiPermutationElement`). A group knows how
    to make its identity and random elements, compose, invert, act on an axis of a
    parameter laid out as ``(outer, n, inner)``, and turn elements into matrices.
    """

    #: whether the element may be an ``m x n`` embedding with ``m != n``.
    rectangular: bool = False
    #: whether elementwise parameters (norm scales and statistics) may live in the
    #: space: only groups that move units without mixing them allow that.
    elementwise_ok: bool = True

    def identity(self, n: int) -> object:
        raise NotImplementedError

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> object:
        raise NotImplementedError

    def compose(self, second: object, first: object) -> object:
        """Element acting as ``first`` then ``second`` (matrix ``second @ first``)."""
        raise NotImplementedError

    def inverse(self, element: object) -> object:
        raise NotImplementedError

    def matrix(self, element: object) -> Tensor:
        """Dense matrix ``T`` of shape ``(m, n)`` with ``h' = T h``."""
        raise NotImplementedError

    def dims(self, element: object) -> tuple[int, int]:
        """``(m, n)``: size of the target and of the source space."""
        raise NotImplementedError

    def act(self, x: Tensor, element: object, role: Role) -> Tensor:
        """Act on ``x`` of shape ``(outer, n, inner)`` along the middle axis."""
        if role == "elementwise":
            raise ValueError(f"{type(self).__name__} cannot act on elementwise parameters")
        if role == "write":
            mat = self.matrix(element).to(x.dtype)
        else:
            mat = self.reader_matrix(element).to(x.dtype)
        return torch.einsum("mn,onk->omk", mat, x)

    def reader_matrix(self, element: object) -> Tensor:
        """Matrix ``L^T`` (``m x n``) applied to a reader's axis, ``L T = I``."""
        return torch.linalg.pinv(self.matrix(element).double()).T


@dataclass(frozen=True)
class Permutation(Group):
    """Permutations of ``n`` units; element ``perm`` with ``h'[i] = h[perm[i]]``.

    ``blocks > 1`` restricts to permutations that map each of ``blocks`` contiguous
    blocks of ``n / blocks`` units onto a block (the symmetry of GroupNorm).
    """

    blocks: int = 1

    def identity(self, n: int) -> Tensor:
        return torch.arange(n)

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        _check_square(m, n, self)
        if n % self.blocks:
            raise ValueError(f"{n} units do not split into {self.blocks} blocks")
        size = n // self.blocks
        order = torch.randperm(self.blocks, generator=generator)
        inner = [torch.randperm(size, generator=generator) for _ in range(self.blocks)]
        return torch.cat([int(b) * size + inner[i] for i, b in enumerate(order)])

    def compose(self, second: Tensor, first: Tensor) -> Tensor:
        # (second @ first) h = second (first h): h''[i] = h'[second[i]] = h[first[second[i]]]
        return first[second]

    def inverse(self, element: Tensor) -> Tensor:
        return torch.argsort(element)

    def matrix(self, element: Tensor) -> Tensor:
        n = element.numel()
        return torch.eye(n, dtype=torch.float64)[element]

    def dims(self, element: Tensor) -> tuple[int, int]:
        return element.numel(), element.numel()

    def act(self, x: Tensor, element: Tensor, role: Role) -> Tensor:
        # P^{-T} = P: writers and readers are permuted alike.
        return x.index_select(1, element.to(x.device))

    def reader_matrix(self, element: Tensor) -> Tensor:
        return self.matrix(element)


@dataclass(frozen=True)
class HeadPermutation(Group):
    """Permutations of attention heads: ``heads`` blocks of ``head_dim`` units each.

    Element: a head permutation ``perm`` of length ``heads``; the space has
    ``n = heads * head_dim`` units and moves whole heads.
    """

    heads: int
    head_dim: int

    def _expand(self, element: Tensor) -> Tensor:
        offsets = torch.arange(self.head_dim)
        return (element[:, None] * self.head_dim + offsets[None, :]).reshape(-1)

    def identity(self, n: int) -> Tensor:
        self._check(n)
        return torch.arange(self.heads)

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        _check_square(m, n, self)
        self._check(n)
        return torch.randperm(self.heads, generator=generator)

    def _check(self, n: int) -> None:
        if n != self.heads * self.head_dim:
            raise ValueError(f"space of {n} units is not {self.heads} heads x {self.head_dim}")

    def compose(self, second: Tensor, first: Tensor) -> Tensor:
        return first[second]

    def inverse(self, element: Tensor) -> Tensor:
        return torch.argsort(element)

    def matrix(self, element: Tensor) -> Tensor:
        n = self.heads * self.head_dim
        return torch.eye(n, dtype=torch.float64)[self._expand(element)]

    def dims(self, element: Tensor) -> tuple[int, int]:
        n = self.heads * self.head_dim
        return n, n

    def act(self, x: Tensor, element: Tensor, role: Role) -> Tensor:
        return x.index_select(1, self._expand(element).to(x.device))

    def reader_matrix(self, element: Tensor) -> Tensor:
        return self.matrix(element)


@dataclass(frozen=True)
class SemiPermutationElement:
    """Sparse ``m x n`` column-stochastic matrix with one nonzero per row.

    Row ``i`` has the value ``coef[i] > 0`` in column ``assign[i]``; the coefficients
    of the rows assigned to one column sum to 1. Unit ``j`` of the narrow space is
    split over the wide units ``{i : assign[i] = j}``.
    """

    assign: Tensor  # (m,) long
    coef: Tensor  # (m,) float, positive
    n: int

    def matrix(self) -> Tensor:
        m = self.assign.numel()
        mat = torch.zeros(m, self.n, dtype=torch.float64)
        mat[torch.arange(m), self.assign] = self.coef.double()
        return mat


@dataclass(frozen=True)
class SemiPermutation(Group):
    """Semi-permutations: split units of a positively homogeneous layer (ReLU).

    A writer row of unit ``j`` is scaled by ``coef[i]`` into each wide unit ``i``;
    readers copy unit ``j``'s column into every such ``i`` (the left inverse ``L``
    with ``L[j, i] = 1`` for ``assign[i] = j``). Valid only where
    ``relu(c x) = c relu(x)`` holds, i.e. for ReLU-like activations.
    """

    rectangular = True
    elementwise_ok = False

    def identity(self, n: int) -> SemiPermutationElement:
        return SemiPermutationElement(torch.arange(n), torch.ones(n), n)

    def random(
        self, n: int, generator: torch.Generator, *, m: int | None = None
    ) -> SemiPermutationElement:
        m = n if m is None else m
        if m < n:
            raise ValueError(f"a semi-permutation embeds {n} units into m >= n, got m={m}")
        # every narrow unit gets at least one wide unit, the rest are spread at random
        extra = torch.randint(0, n, (m - n,), generator=generator)
        assign = torch.cat([torch.arange(n), extra])[torch.randperm(m, generator=generator)]
        raw = torch.rand(m, generator=generator, dtype=torch.float64) + 0.5
        totals = torch.zeros(n, dtype=torch.float64).index_add_(0, assign, raw)
        return SemiPermutationElement(assign, (raw / totals[assign]).float(), n)

    def compose(
        self, second: SemiPermutationElement, first: SemiPermutationElement
    ) -> SemiPermutationElement:
        assign = first.assign[second.assign]
        coef = second.coef * first.coef[second.assign]
        return SemiPermutationElement(assign, coef, first.n)

    def inverse(self, element: SemiPermutationElement) -> SemiPermutationElement:
        m = element.assign.numel()
        if m != element.n or not torch.equal(torch.sort(element.assign).values, torch.arange(m)):
            raise ValueError("only square semi-permutations (permutations) are invertible")
        # a square semi-permutation with column sums 1 is a permutation matrix
        return SemiPermutationElement(torch.argsort(element.assign), torch.ones(m), m)

    def matrix(self, element: SemiPermutationElement) -> Tensor:
        return element.matrix()

    def dims(self, element: SemiPermutationElement) -> tuple[int, int]:
        return element.assign.numel(), element.n

    def act(self, x: Tensor, element: SemiPermutationElement, role: Role) -> Tensor:
        if role == "elementwise":
            # splitting a unit rescales it: a norm's per-unit parameters cannot follow
            raise ValueError("SemiPermutation cannot act on elementwise parameters")
        picked = x.index_select(1, element.assign.to(x.device))
        if role == "read":
            return picked
        return picked * element.coef.to(x)[None, :, None]

    def reader_matrix(self, element: SemiPermutationElement) -> Tensor:
        return (element.matrix() > 0).double()


@dataclass(frozen=True)
class Orthogonal(Group):
    """Orthogonal maps ``O`` (``O^T O = I``); rectangular ``m x n`` (``m >= n``) embed.

    Readers are contracted with ``O`` too (``O^{-T} = O``; for a rectangular map the
    reader becomes ``R O^T``, which satisfies ``R O^T O = R``).
    """

    rectangular = True
    elementwise_ok = False

    def identity(self, n: int) -> Tensor:
        return torch.eye(n)

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        m = n if m is None else m
        if m < n:
            raise ValueError(f"an orthogonal embedding maps n={n} into m >= n, got m={m}")
        gauss = torch.randn(m, n, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gauss)
        # sign fix makes the draw Haar-distributed
        return (q * torch.sign(torch.diagonal(r))[None, :]).float()

    def compose(self, second: Tensor, first: Tensor) -> Tensor:
        return second @ first

    def inverse(self, element: Tensor) -> Tensor:
        if element.shape[0] != element.shape[1]:
            raise ValueError("a rectangular orthogonal embedding has no inverse")
        return element.T.contiguous()

    def matrix(self, element: Tensor) -> Tensor:
        return element.double()

    def dims(self, element: Tensor) -> tuple[int, int]:
        return element.shape[0], element.shape[1]

    def reader_matrix(self, element: Tensor) -> Tensor:
        return element.double()


@dataclass(frozen=True)
class Invertible(Group):
    """General invertible maps ``A`` (``n x n``); readers get ``A^{-T}``."""

    elementwise_ok = False

    def identity(self, n: int) -> Tensor:
        return torch.eye(n)

    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> Tensor:
        _check_square(m, n, self)
        # well conditioned: orthogonal times a diagonal with entries in [0.5, 2]
        q = Orthogonal().random(n, generator).double()
        scale = 0.5 + 1.5 * torch.rand(n, generator=generator, dtype=torch.float64)
        return (q * scale[None, :]).float()

    def compose(self, second: Tensor, first: Tensor) -> Tensor:
        return second @ first

    def inverse(self, element: Tensor) -> Tensor:
        return torch.linalg.inv(element.double()).to(element.dtype)

    def matrix(self, element: Tensor) -> Tensor:
        return element.double()

    def dims(self, element: Tensor) -> tuple[int, int]:
        return element.shape[0], element.shape[1]

    def reader_matrix(self, element: Tensor) -> Tensor:
        return torch.linalg.inv(element.double()).T


def _check_square(m: int | None, n: int, group: Group) -> None:
    if m is not None and m != n:
        raise ValueError(f"{type(group).__name__} elements are square; got m={m}, n={n}")


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
    """Where a space's features can be observed: a module's output and its feature axis."""

    module: str
    axis: int = -1


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
                shape = params[use.param].shape
                if not -len(shape) <= use.axis < len(shape):
                    raise ValueError(
                        f"{use.param!r} of shape {tuple(shape)} has no axis {use.axis}"
                    )
                want = use.outer * space.n * use.inner
                if shape[use.axis] != want:
                    raise ValueError(
                        f"space {space.name!r} (n={space.n}) expects axis {use.axis} of "
                        f"{use.param!r} to have size {want}, found {shape[use.axis]}"
                    )
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


def _act_on_axis(x: Tensor, use: Use, group: Group, element: object, n: int) -> Tensor:
    axis = use.axis % x.ndim
    moved = x.movedim(axis, 0)
    rest = moved.shape[1:]
    blocked = moved.reshape(use.outer, n, use.inner * math.prod(rest))
    out = group.act(blocked, element, use.role)
    m = out.shape[1]
    return out.reshape(use.outer * m * use.inner, *rest).movedim(0, axis)


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
        out = _act_on_axis(out, use, space.group, transform.elements[space.name], space.n)
    return out


def apply(spec: SymmetrySpec, params: Params, transform: Transform) -> Params:
    """Return new params with ``transform`` applied; ``params`` is not modified.

    Parameters that no space uses are passed through (same tensor objects).
    Integer tensors (e.g. BatchNorm's ``num_batches_tracked``) are never transformed.
    """
    if transform.spec is not spec and transform.spec.names != spec.names:
        raise ValueError("transform was made for a different spec")
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
