"""Which feature variables may move differently inside each unit of another.

A parameter axis often holds several live variables, e.g. the rows of a query projection
are key/value groups x query heads of a group x features of a head. One group element per
variable would move every head's features by the same map; but when attention runs head
by head, each head may have its own. The rule: variable ``x`` is *batched* by variable
``y`` when every tensor of the graph that holds ``x`` also holds ``y`` (on any axis).
Then no op ever sees ``x``'s units without knowing which unit of ``y`` they belong to:
linear maps either carry ``y`` along (written or batched) or contract it together with
``x``, and elementwise ops act within each ``y`` slice, so a different element of ``x``'s
group per unit of ``y`` keeps every op's result (the contractions pair each slice's
element with its own inverse). A tensor holding ``x`` without ``y`` -- a weight shared
by every head, a sum over the heads -- forces one element for all. Tables of constants
are not counted: what they allow is the variable's level (a constant varying along it
pins it), and where they pin a query/key basis a check decides what survives
(:mod:`lmckit.inference._qk_basis`).

:func:`batched_by` computes, per variable, the variables it is batched by;
:func:`head_kinds` names the variables of attention operands (query/key features,
value features) so nested spaces get names that say what they move.
"""

from __future__ import annotations

from collections.abc import Iterable

from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._lattice import Level, Var

__all__ = ["batched_by", "head_kinds", "nests"]


def _values(obj: object) -> Iterable[Value]:
    if isinstance(obj, Value):
        yield obj
    elif isinstance(obj, list | tuple):
        for item in obj:
            yield from _values(item)


def batched_by(an: Analysis, *, but_scales: bool = False) -> dict[int, set[int]]:
    """Per leaf variable (by ``id``), the leaf variables that every tensor holding it
    also holds (itself included).

    ``but_scales``: parameters that only scale units (a norm's weight) are not counted.
    A map of a group that commutes with such scales (signs) leaves them as they are, so
    a weight all heads share does not keep each head from its own element; a group that
    would move the weight is refused by the check.
    """
    together: dict[int, set[int]] = {}
    for obj in an.values.values():
        for value in _values(obj):
            if value.const:
                # a table of constants (positions, masks) constrains a variable's level,
                # which the lattice records; a check decides what else it allows
                continue
            if but_scales and _only_scales(an, value):
                continue
            # a glued axis (a concatenation) holds the units of each of its pieces
            leaves = {id(v) for axis in value.axes for v in an.lattice.atoms(axis)}
            for leaf in leaves:
                if leaf in together:
                    together[leaf] &= leaves
                else:
                    together[leaf] = set(leaves)
    return together


def _only_scales(an: Analysis, value: Value) -> bool:
    """Whether ``value`` is a view of parameters whose every use scales units."""
    axes = [axis for src in value.src for axis in src]
    return bool(axes) and all(an.roles.get(axis) == {"elementwise"} for axis in axes)


def head_kinds(an: Analysis) -> dict[int, str]:
    """Leaf variables (by ``id``) of attention operands' feature axes: ``"qk"`` for the
    query/key features a score contracts, ``"value"`` for the value features, ``"basis"``
    for one variable that is both (a fused projection split where its axis is not one
    variable that can be cut into blocks: the chunks share their units)."""
    kinds: dict[int, str] = {}

    def mark(node_name: str, kind: str) -> None:
        value = an.values.get(node_name)
        if not isinstance(value, Value) or not value.axes:
            return
        for var in an.lattice.atoms(value.axes[-1]):
            key = id(var)
            kinds[key] = "basis" if kinds.get(key, kind) != kind else kind

    for site in an.attention:
        mark(site.query, "qk")
        mark(site.key, "qk")
        mark(site.value, "value")
    return kinds


def nests(an: Analysis, outer: Var, inner: Var, together: dict[int, set[int]]) -> bool:
    """Whether ``inner`` can be a nested space in the units of ``outer``: ``outer``
    moves whole units (not an orthogonal stream) and ``inner`` is batched by it."""
    return outer.level == Level.PERM and id(outer) in together.get(id(inner), set())
