"""The algebra of feature axes that symmetry inference computes with.

Every axis of every tensor in a traced graph is described by a list of *factors*
(row-major, like a shape): an axis of size 12 might be ``[h]`` or, after a reshape into
attention heads, ``[h(3), d(4)]``. Each factor is a :class:`Var`, a union-find node
standing for "the same units, moved by the same group element". Ops unify the factors
of the axes they tie together (a linear layer's input axis with its weight's column
axis; both operands of a residual addition) and constrain how much symmetry a variable
keeps (its :class:`Level`):

* ``ORTH``: every op touching it commutes with orthogonal maps (linear maps, sums,
  scalings by invariants such as ``1 / rms(x)``);
* ``CENTERED``: something reads the mean of the units or adds one number to all of them
  (a LayerNorm's mean subtraction, a bias broadcast over the axis): orthogonal maps that
  fix the all-ones vector commute with it (:class:`~lmckit.groups.CenteredOrthogonal`);
* ``PERM``: something acts unit by unit (an activation, a norm's scale, a product of two
  features): only permutations remain;
* ``FREE``: pinned, not a symmetry at all (inputs, outputs, constants that vary along
  the axis, anything the rules do not understand).

A reshape that splits a variable's units refines it into a product of new variables
(:meth:`Lattice.split`); later unifications see the refinement. The final structure of
a parameter axis is the expansion of its variable into leaves.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

from lmckit.inference._var import Level, Var

__all__ = ["Lattice", "Level", "Var"]


class Lattice:
    """The variables of one analysis, and the operations that constrain them."""

    def __init__(self) -> None:
        self._count = 0

    def fresh(self, size: int, level: Level = Level.ORTH, reason: str | None = None) -> Var:
        """A new variable; size-1 variables are always pinned (nothing to move)."""
        self._count += 1
        var = Var(self._count, size, level if size > 1 else Level.FREE)
        if reason is not None and var.level < Level.ORTH:
            var.reasons.append(reason)
        return var

    @staticmethod
    def find(var: Var) -> Var:
        root = var
        while root.parent is not root:
            root = root.parent
        while var.parent is not root:  # path compression
            var.parent, var = root, var.parent
        return root

    def leaves(self, factors: Iterable[Var]) -> list[Var]:
        """The unrefined roots a factor list expands to, size-1 factors dropped."""
        out: list[Var] = []
        stack = list(factors)[::-1]
        while stack:
            var = self.find(stack.pop())
            if var.parts is not None:
                stack.extend(var.parts[::-1])
            elif var.size > 1:
                out.append(var)
        return out

    # ------------------------------------------------------------------ constraints

    def lower(self, factors: Iterable[Var], level: Level, reason: str) -> None:
        """Cap the level of every leaf of ``factors`` (and of their pieces) at ``level``."""
        for leaf in self.leaves(factors):
            if leaf.level > level:
                leaf.level = level
                leaf.reasons.append(reason)
            if leaf.pieces:  # what holds for the whole axis holds for each block of it
                self.lower([piece for _, piece in leaf.pieces], level, reason)

    def cut(self, var: Var, start: int, length: int) -> Var | None:
        """The piece of leaf ``var`` holding units ``[start, start + length)``.

        Slices that cut a variable into consecutive blocks make it a direct sum: each
        block moves by its own element (the query, key and value blocks of a fused
        projection; the rotary and pass-through dimensions of a head). None when the
        slice overlaps a block cut before at other offsets, or the variable is refined
        into a product: the caller pins it.
        """
        root = self.find(var)
        if root.parts is not None or not 0 <= start < start + length <= root.size:
            return None
        pieces = root.pieces if root.pieces is not None else []
        for begin, piece in pieces:
            piece = self.find(piece)
            if begin == start and piece.size == length:
                return piece
            if begin < start + length and start < begin + piece.size:
                return None
        new = self.fresh(length, root.level)
        new.reasons = list(root.reasons)
        new.whole = root
        root.pieces = sorted([*pieces, (start, new)], key=lambda p: p[0])
        return new

    def pieces(self, var: Var) -> list[tuple[int, Var]] | None:
        """The blocks of a variable cut by :meth:`cut`, covering it in order (a gap no
        slice reads becomes a pinned block of its own), or None if it was not cut."""
        root = self.find(var)
        if not root.pieces:
            return None
        out: list[tuple[int, Var]] = []
        at = 0
        for start, piece in root.pieces:
            if start > at:
                out.append((at, self.fresh(start - at, Level.FREE, "no slice reads it")))
            out.append((start, self.find(piece)))
            at = start + piece.size
        if at < root.size:
            out.append((at, self.fresh(root.size - at, Level.FREE, "no slice reads it")))
        return out

    def center(self, factors: Iterable[Var], reason: str) -> None:
        """Only maps that fix the mean of the units survive ``reason``."""
        self.lower(factors, Level.CENTERED, reason)

    def pin(self, factors: Iterable[Var], reason: str) -> None:
        self.lower(factors, Level.FREE, reason)

    def split(self, var: Var, sizes: Sequence[int]) -> list[Var]:
        """Refine a leaf into the product of new leaves of ``sizes`` (row-major)."""
        root = self.find(var)
        if root.parts is not None:
            raise ValueError(f"{root} is already refined")
        if math.prod(sizes) != root.size:
            raise ValueError(f"cannot split {root} into {list(sizes)}")
        if root.pieces:  # cut into blocks and reshaped: neither structure is kept
            self._collapse(root, "a reshape of an axis cut into blocks")
        parts = []
        for size in sizes:
            part = self.fresh(size, root.level)
            part.reasons = list(root.reasons)
            part.heads = root.heads
            part.residual = root.residual
            part.fixed = root.fixed
            parts.append(part)
        if root.blocks > 1 and root.level > Level.FREE:
            # a GroupNorm's blocks cannot be cut by a reshape we do not understand
            self.pin(parts, "a reshape splits GroupNorm groups")
        root.parts = parts
        parts[0].leads = root
        return parts

    def cut_leading(
        self, lead: Var, start: int, length: int, rest: Sequence[Var]
    ) -> list[Var] | None:
        """The block ``[start, start + length)`` of the leading factor ``lead`` of a
        product ``[lead, *rest]``, as the factors ``[piece, *rest']`` of a block of the
        product itself; or None.

        A fused projection viewed as ``[heads + 2, head_dim]`` and cut along the first
        axis (a multi-query attention's query heads, its key head, its value head) is a
        direct sum of blocks of the whole axis, each a product of its own: the query
        heads' ``head_dim`` is not the value head's. Only a product whose factors no other
        axis names yet is re-cut (the slices right after a reshape); else None, and the
        caller cuts ``lead`` alone.
        """
        lead = self.find(lead)
        if lead.leads is None:
            return None
        whole = self.find(lead.leads)
        rest = [self.find(v) for v in rest]
        factors = [lead, *rest]
        if whole.factored is None:
            if whole.parts is None or self.leaves(whole.parts) != factors:
                return None
            if any(v.joined or v.pieces or v.parts is not None for v in factors):
                return None
            whole.factored, whole.parts = factors, None
        elif [self.find(v) for v in whole.factored] != factors:
            return None
        inner = math.prod(v.size for v in rest)
        piece = self.cut(whole, start * inner, length * inner)
        if piece is None:
            return None
        if piece.parts is None:
            new = self.split(piece, [length, *(v.size for v in rest)])
            for part, old in zip(new, factors, strict=True):
                part.level = min(part.level, old.level)
                part.reasons += [r for r in old.reasons if r not in part.reasons]
                part.heads, part.residual, part.fixed = old.heads, old.residual, old.fixed
        return [self.find(v) for v in piece.parts or []]

    def join(self, blocks: Sequence[Sequence[Var]], reason: str) -> Var | None:
        """A new variable glued from consecutive ``blocks`` (factor lists), each moved by
        its own element: a concatenation along a feature axis is the direct sum of its
        parts' spaces, and two copies of one space are moved by the same element. None
        when no block has anything to move."""
        found = [self.leaves(block) for block in blocks]
        if all(v.level == Level.FREE for leaves in found for v in leaves):
            return None
        pieces: list[tuple[int, Var]] = []
        at = 0
        for block, leaves in zip(blocks, found, strict=True):
            size = math.prod(self.find(v).size for v in block)
            if len(leaves) == 1:
                piece = leaves[0]
            else:  # a product (or a size-one block): one variable of its size holds it
                piece = self.fresh(size)
                if leaves:
                    self.unify([piece], leaves, reason)
            pieces.append((at, self.find(piece)))
            at += size
        whole = self.fresh(at)
        whole.pieces, whole.direct = pieces, True
        return whole

    def atoms(self, factors: Iterable[Var]) -> list[Var]:
        """:meth:`leaves`, each glued variable (:meth:`join`) followed by the atoms of its
        pieces: every variable whose units a tensor of these factors holds."""
        out: list[Var] = []
        stack = self.leaves(factors)[::-1]
        while stack:
            leaf = self.find(stack.pop())
            if leaf in out:
                continue
            out.append(leaf)
            if leaf.direct and leaf.pieces:
                stack += self.leaves([p for _, p in leaf.pieces])[::-1]
        return out

    def _collapse(self, root: Var, reason: str) -> None:
        """Forget the blocks of a cut variable and pin it (it is one axis again); the
        pieces of a glued one are pinned with it (they are its units)."""
        pieces = [p for _, p in root.pieces or []]
        root.pieces = None
        self.pin([root], reason)
        if root.direct:
            root.direct = False
            self.pin(pieces, reason)

    def _kept_pieces(self, ra: Var, rb: Var, reason: str) -> list[tuple[int, Var]] | None:
        """The blocks the union of roots ``ra`` and ``rb`` keeps, when one is glued
        (:meth:`join`): its blocks, if the other has none, or both glued alike (blocks
        unified pairwise); else None (both forget theirs)."""
        glued = [v for v in (ra, rb) if v.direct and v.pieces]
        if not glued:
            return None
        other = rb if glued[0] is ra else ra
        pieces = list(glued[0].pieces or [])
        if any(self.find(p) in (ra, rb) for _, p in pieces):
            return None
        if other.pieces is None:
            return pieces
        mine = [(s, self.find(p).size) for s, p in pieces]
        if not other.direct or mine != [(s, self.find(p).size) for s, p in other.pieces]:
            return None
        for (_, p), (_, q) in zip(pieces, other.pieces, strict=True):
            self.unify([p], [q], reason)
        return [(s, self.find(p)) for s, p in pieces]

    def _union(self, a: Var, b: Var) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return
        kept = self._kept_pieces(ra, rb, "glued axes meet")
        ra, rb = self.find(ra), self.find(rb)
        if ra is rb:  # pragma: no cover - blocks of a glued axis are never the axis itself
            return
        for cut in (ra, rb):
            if cut.pieces and kept is None:  # blocks of two variables need not line up
                self._collapse(cut, "an axis cut into blocks meets another axis")
        rb.parent = ra
        ra.joined = rb.joined = True
        if rb.level < ra.level:
            ra.level = rb.level
        ra.reasons += [r for r in rb.reasons if r not in ra.reasons]
        ra.blocks = math.lcm(ra.blocks, rb.blocks)
        ra.heads = ra.heads or rb.heads
        ra.residual = ra.residual or rb.residual
        ra.fixed = ra.fixed or rb.fixed
        ra.whole = ra.whole or rb.whole
        if kept is not None:
            rb.pieces, rb.direct = None, False
            ra.pieces, ra.direct = kept, True
            # what held for either axis holds for each of its blocks
            self.lower([p for _, p in kept], ra.level, "a glued axis meets another axis")

    def unify(self, a: Sequence[Var], b: Sequence[Var], reason: str) -> None:
        """Make two factor lists of one axis size describe the same units.

        The lists are aligned like two shapes of one reshape: a factor on one side that
        spans several on the other is split. If no common refinement exists (e.g.
        ``[6, 4]`` against ``[4, 6]``) every factor involved is pinned.
        """
        self._align(a, b, reason, merge=True)

    def constrain(self, a: Sequence[Var], b: Sequence[Var], reason: str) -> None:
        """Cap each factor of ``a`` at the level of the factors of ``b`` it lines up
        with (aligned as in :meth:`unify`), without making them the same units: an
        activation multiplied by a table of constants keeps what the table allows, but
        two activations that meet the same table (rotary angles shared by every layer)
        stay free of each other. Attention heads meeting a table that varies from head
        to head (ALiBi slopes) are :attr:`Var.fixed` instead: their order is fixed, what
        each holds is not."""
        self._align(a, b, reason, merge=False)

    def _align(self, a: Sequence[Var], b: Sequence[Var], reason: str, *, merge: bool) -> None:
        left, right = deque(self.leaves(a)), deque(self.leaves(b))
        total_left = math.prod(v.size for v in left)
        total_right = math.prod(v.size for v in right)
        if total_left != total_right:
            self.pin([*left, *right], f"{reason}: axis sizes {total_left} and {total_right}")
            return
        while left and right:
            x, y = self.find(left[0]), self.find(right[0])
            if x.parts is not None or y.parts is not None:
                # refined by an earlier step of this loop: expand in place
                for side, var in ((left, x), (right, y)):
                    if var.parts is not None:
                        side.popleft()
                        side.extendleft(reversed(self.leaves(var.parts)))
                continue
            if x is y:
                left.popleft()
                right.popleft()
            elif x.size == y.size:
                if merge:
                    self._union(x, y)
                elif x.heads and y.level == Level.FREE:
                    x.fixed = x.fixed or reason
                else:  # as for the whole axis, so for each of its blocks
                    self.lower([x], y.level, reason)
                left.popleft()
                right.popleft()
            elif y.size % x.size == 0:
                self.split(y, [x.size, y.size // x.size])
            elif x.size % y.size == 0:
                self.split(x, [y.size, x.size // y.size])
            else:
                self.pin([*left, *right], f"{reason}: incompatible factorizations")
                return
