"""The lattice's glued variables (:meth:`Lattice.join`): a direct sum of blocks that
keeps its blocks when it meets another axis, and gives each block what holds for it."""

from __future__ import annotations

from lmckit.inference._lattice import Lattice, Level


def test_a_join_of_pinned_blocks_has_nothing_to_move() -> None:
    lat = Lattice()
    assert lat.join([[lat.fresh(3, Level.FREE)], [lat.fresh(2, Level.FREE)]], "t") is None


def test_a_join_meeting_a_plain_axis_keeps_its_blocks() -> None:
    lat = Lattice()
    a, b = lat.fresh(3), lat.fresh(2)
    whole = lat.join([[a], [b]], "t")
    assert whole is not None
    reader = lat.fresh(5)
    lat.unify([reader], [whole], "a reader's columns")
    assert lat.pieces(reader) == [(0, a), (3, b)]


def test_two_copies_of_one_variable_are_both_blocks() -> None:
    lat = Lattice()
    stream = lat.fresh(4)
    whole = lat.join([[stream], [stream]], "t")
    assert whole is not None and lat.pieces(whole) == [(0, stream), (4, stream)]


def test_two_joins_alike_are_unified_block_by_block() -> None:
    lat = Lattice()
    a, b, c, d = lat.fresh(3), lat.fresh(2), lat.fresh(3), lat.fresh(2)
    left, right = lat.join([[a], [b]], "t"), lat.join([[c], [d]], "t")
    assert left is not None and right is not None
    lat.unify([left], [right], "t")
    assert lat.find(a) is lat.find(c) and lat.find(b) is lat.find(d)
    assert lat.find(a).level == Level.ORTH


def test_joins_that_do_not_line_up_are_pinned_with_their_blocks() -> None:
    lat = Lattice()
    a, b, c, d = lat.fresh(3), lat.fresh(2), lat.fresh(2), lat.fresh(3)
    left, right = lat.join([[a], [b]], "t"), lat.join([[c], [d]], "t")
    assert left is not None and right is not None
    lat.unify([left], [right], "t")
    assert all(lat.find(v).level == Level.FREE for v in (a, b, c, d))


def test_what_holds_for_a_glued_axis_holds_for_each_block() -> None:
    lat = Lattice()
    a, b = lat.fresh(3), lat.fresh(2)
    whole = lat.join([[a], [b]], "t")
    assert whole is not None
    lat.lower([whole], Level.PERM, "a norm's scale")
    assert lat.find(a).level == lat.find(b).level == Level.PERM
    # a table of constants varying along it (positions) constrains every block too
    lat.constrain([whole], [lat.fresh(5, Level.FREE)], "positions")
    assert lat.find(a).level == lat.find(b).level == Level.FREE


def test_a_level_met_in_a_union_reaches_the_blocks() -> None:
    lat = Lattice()
    a, b = lat.fresh(3), lat.fresh(2)
    whole = lat.join([[a], [b]], "t")
    assert whole is not None
    lat.unify([whole], [lat.fresh(5, Level.CENTERED)], "t")
    assert lat.find(a).level == lat.find(b).level == Level.CENTERED


def test_a_reshaped_join_is_pinned_with_its_blocks() -> None:
    lat = Lattice()
    a, b = lat.fresh(2), lat.fresh(2)
    whole = lat.join([[a], [b]], "t")
    assert whole is not None
    lat.split(whole, [2, 2])
    assert lat.find(a).level == lat.find(b).level == Level.FREE


def test_a_block_of_several_factors_is_one_variable_of_its_size() -> None:
    lat = Lattice()
    heads, dim, rest = lat.fresh(2), lat.fresh(3), lat.fresh(4)
    whole = lat.join([[heads, dim], [rest]], "t")
    assert whole is not None
    first = lat.pieces(whole)[0][1]
    assert first.size == 6 and lat.leaves([first]) == [lat.find(heads), lat.find(dim)]
    # the atoms of a tensor holding the glued axis: every variable whose units it holds
    assert set(lat.atoms([whole])) == {lat.find(v) for v in (whole, heads, dim, rest)}
