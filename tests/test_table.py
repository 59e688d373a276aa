"""Plain-text tables: widths fit the cells, missing values print as the column says."""

from __future__ import annotations

from lmckit.measure._table import Column, format_table, percent


def test_table_columns() -> None:
    rows = [{"name": "a", "x": 0.5, "y": 0.123456}, {"name": "long name", "x": None, "y": 2.0}]
    table = format_table(
        rows, [Column("name", "name", align="<"), percent("x", "x", 1), Column("y", "y", ".3f")]
    )
    assert table.splitlines() == [
        "name           x      y",
        "-----------------------",
        "a          50.0%  0.123",
        "long name      -  2.000",
    ]


def test_a_table_has_its_title_above_the_header() -> None:
    table = format_table([{"k": 1}], [Column("key", "k")], title="T")
    assert table.splitlines() == ["T", "key", "---", "  1"]
