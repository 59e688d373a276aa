"""The factors of feature axes (:class:`Var`) and how much symmetry each keeps
(:class:`Level`); the union-find over them is :class:`lmckit.inference._lattice.Lattice`."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Level", "Var"]


class Level(IntEnum):
    """How much symmetry a variable keeps: the meet of every constraint put on it."""

    FREE = 0
    PERM = 1
    CENTERED = 2
    ORTH = 3


class Var:
    """A factor of a feature axis: ``size`` units moved together by one group element.

    Only a root (``find(v) is v``) carries meaningful state. ``parts`` set means the
    variable was refined into the product of those variables (row-major).
    """

    __slots__ = (
        "blocks", "direct", "factored", "fixed", "heads", "id", "joined", "leads", "level",
        "parent", "parts", "pieces", "reasons", "residual", "size", "whole",
    )  # fmt: skip

    def __init__(self, vid: int, size: int, level: Level) -> None:
        self.id = vid
        self.size = size
        self.parent: Var = self
        self.level = level
        self.reasons: list[str] = []
        self.parts: list[Var] | None = None
        #: set when slices cut the variable into consecutive blocks (a fused query/key/
        #: value projection cut by offsets): ``(start, piece)`` in order; each piece is a
        #: variable of its own, and the variable itself holds no space (see :meth:`cut`)
        self.pieces: list[tuple[int, Var]] | None = None
        #: for a piece, the variable it was cut from
        self.whole: Var | None = None
        #: the pieces are variables of their own the axis was glued from (a
        #: concatenation: :meth:`Lattice.join`), not blocks cut out of it
        self.direct = False
        #: for the leading factor of a product (see :meth:`Lattice.split`): that product
        self.leads: Var | None = None
        #: for a product turned into a direct sum by :meth:`Lattice.cut_leading`: the
        #: factors it had, which the slices of its reshaped axes still name
        self.factored: list[Var] | None = None
        #: unified with another variable (other axes name it: it cannot be re-cut)
        self.joined = False
        #: GroupNorm: units must move in ``blocks`` contiguous groups.
        self.blocks = 1
        #: the batch axis of attention (heads): permuted as whole heads.
        self.heads = False
        #: heads whose order a constant fixes (one that differs from head to head, added
        #: to or multiplying their scores: ALiBi slopes), and where: not a space, but what
        #: each head holds may still move head by head
        self.fixed: str | None = None
        #: two activations are added along it (a residual stream).
        self.residual = False

    def __repr__(self) -> str:
        return f"Var#{self.id}(size={self.size}, {self.level.name})"
