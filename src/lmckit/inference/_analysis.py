"""The state of one symmetry analysis: abstract values of graph nodes, parameter roles, sites.

An abstract :class:`Value` mirrors a tensor of the traced graph: for every axis, the
factor list of :class:`~lmckit.inference._lattice.Var` it carries, and for every axis the
parameter axes it is a view of (so that an op reading a transposed weight still knows
which parameter axis it reads). The :class:`Analysis` holds every value, the roles
parameter axes play (write / read / elementwise) and the sites later passes need
(norm scales that can be folded, attention patterns for circuits).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from torch.fx import Node

from lmckit.inference._lattice import Lattice, Level, Var
from lmckit.inference._trace import TracedGraph

__all__ = ["Analysis", "AttentionSite", "ExpertSite", "Role", "ScaleSite", "Value"]

Role = Literal["write", "read", "elementwise"]
ParamAxis = tuple[str, int]  # (state-dict key, axis)


@dataclass
class Value:
    """Abstract tensor: per axis its factor list and the parameter axes it views.

    Attributes:
        axes: one factor list per axis (a size-1 axis has an empty list).
        src: per axis, the parameter axes this axis is an unchanged view of.
        square: an elementwise square of a covariant value (or a scalar multiple): its
            sum over an axis is invariant under orthogonal maps (a squared norm).
        const: computed from neither inputs nor parameters (masks, positions, tables).
    """

    axes: list[list[Var]]
    src: list[frozenset[ParamAxis]] = field(default_factory=list)
    square: bool = False
    const: bool = False

    def __post_init__(self) -> None:
        if not self.src:
            self.src = [frozenset() for _ in self.axes]

    @property
    def ndim(self) -> int:
        return len(self.axes)

    def factors(self) -> list[Var]:
        return [v for axis in self.axes for v in axis]


@dataclass(frozen=True)
class ScaleSite:
    """A parameter vector multiplying a feature axis elementwise (a norm's scale).

    ``node`` is the product (or the norm op); ``bias`` a vector added right after it
    (a LayerNorm's shift). Folding the scale into the product's readers is exact when
    every consumer of ``node`` is a linear reader: see :mod:`lmckit.inference.rewrites`.
    """

    node: str
    weight: str | None
    bias: str | None
    kind: Literal["layer", "rms", "scale"]
    eps: float | None = None
    #: the scale is ``offset + weight`` (Gemma's RMSNorm multiplies by ``1 + w``)
    offset: float = 0.0


@dataclass(frozen=True)
class AttentionSite:
    """A scaled-dot-product attention: the graph nodes of its query, key, value, output."""

    node: str
    query: str
    key: str
    value: str


@dataclass(frozen=True)
class ExpertSite:
    """A grouped matrix product: rows of ``input`` in segments (``offsets``), segment
    ``g`` multiplied by ``weight[g]`` -- the experts of a mixture, stacked on axis 0 of
    the weight parameter ``weight`` (a state-dict key)."""

    node: str
    weight: str
    offsets: str


class Analysis:
    """Mutable state of one pass over a traced graph (see :mod:`lmckit.inference._infer`)."""

    def __init__(self, traced: TracedGraph) -> None:
        self.traced = traced
        self.lattice = Lattice()
        self.values: dict[str, Any] = {}
        #: state-dict key -> one variable per axis (tied placeholders share them)
        self.param_vars: dict[str, list[Var]] = {}
        self.roles: dict[ParamAxis, set[Role]] = {}
        self.scales: list[ScaleSite] = []
        self.attention: list[AttentionSite] = []
        self.experts: list[ExpertSite] = []
        #: products of two activations along a feature axis (gates), by node name
        self.products: list[str] = []
        #: why things were left out that a user may not expect (unknown ops, ...)
        self.notes: list[str] = []
        #: where slices cut a one-variable axis: (variable, offset of the cut), e.g. the
        #: end of the rotary part of partially rotary heads
        self.cuts: list[tuple[Var, int]] = []

    # ------------------------------------------------------------------ values

    def fresh(self, sizes: Sequence[int], level: Level, reason: str | None = None) -> Value:
        """A value of new variables, one per axis."""
        axes = [[self.lattice.fresh(int(s), level, reason)] for s in sizes]
        return Value(axes, const=level == Level.FREE)

    def free(self, sizes: Sequence[int], reason: str) -> Value:
        return self.fresh(sizes, Level.FREE, reason)

    def pin(self, values: Iterable[Value], reason: str, *, notable: bool = False) -> None:
        """Pin every variable of ``values``; ``notable`` reasons go into the report."""
        factors = [v for value in values for v in value.factors()]
        leaves = [v for v in self.lattice.leaves(factors) if v.level > Level.FREE]
        if notable and leaves:
            self.note(reason)
        self.lattice.pin(factors, reason)

    def lower(self, values: Iterable[Value], reason: str) -> None:
        """Only permutations survive ``reason`` on every variable of ``values``."""
        factors = [v for value in values for v in value.factors()]
        self.lattice.lower(factors, Level.PERM, reason)

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    # ------------------------------------------------------------------ parameter roles

    def mark(self, value: Value, axis: int, role: Role) -> None:
        """Record that ``value``'s ``axis`` (and the parameter axes it views) plays ``role``."""
        for param_axis in value.src[axis]:
            self.roles.setdefault(param_axis, set()).add(role)

    def unify(self, a: Sequence[Var], b: Sequence[Var], reason: str) -> None:
        self.lattice.unify(a, b, reason)

    def value(self, arg: Any) -> Any:
        """The abstract value of a node argument (nodes are looked up; others pass)."""
        if isinstance(arg, Node):
            return self.values[arg.name]
        if isinstance(arg, list | tuple):
            return type(arg)(self.value(a) for a in arg)
        return arg

    def is_activation(self, arg: object) -> bool:
        """Whether a node argument holds activations: neither constants nor a parameter's
        values (an axis with parameter provenance)."""
        value = self.values.get(arg.name) if isinstance(arg, Node) else None
        return isinstance(value, Value) and not value.const and not any(value.src)
