"""Spaces and specs: the data half of the symmetry algebra (:mod:`lmckit.symmetry`).

A :class:`SymmetrySpec` is a tuple of named hidden feature :class:`Space` s, each with a
group and its :class:`Use` s (which parameter axis lives in the space, and whether the
parameter writes into it, reads from it or scales it elementwise), plus the
:class:`Probe` s where activation matching reads it and, for attention heads, the
:class:`HeadCircuits` that weight matching compares. Transforms acting on them live in
:mod:`lmckit.symmetry`, which re-exports everything here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lmckit.groups import Group, Role

__all__ = ["CircuitPart", "HeadCircuits", "Probe", "Space", "SymmetrySpec", "Use"]


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
    is ``O_h V_h``. Heads are matched on these, see :mod:`lmckit.aligners.weight.circuits`.
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

    def check_axis(self, use: Use, shape: torch.Size) -> None:
        """Raise ``ValueError`` unless axis ``use.axis`` of ``shape`` has this space's size."""
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
                space.check_axis(use, params[use.param].shape)
                if use.role == "elementwise" and not space.group.elementwise_ok:
                    raise ValueError(
                        f"{type(space.group).__name__} space {space.name!r} cannot act on "
                        f"elementwise parameter {use.param!r}"
                    )
