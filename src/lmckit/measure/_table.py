"""Plain-text tables: columns as data, one formatter.

A table is a list of :class:`Column` over rows (mappings, e.g. JSON rows)::

    format_table(rows, [
        Column("method", "method", align="<"),
        Column("loss barrier", "barrier_loss", ".4f"),
        percent("acc barrier", "barrier_acc"),
    ])

Column widths fit the widest cell; a missing value (``None`` or an absent key) prints as
the column's ``missing`` text. :func:`lmckit.measure._measure.path_table` is the table of path
results the command line prints; experiments build theirs the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Column", "Row", "format_table", "percent"]

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Column:
    """One column of a table.

    Attributes:
        header: the column's title.
        value: a row key, or a function of the row.
        spec: format spec of the value (e.g. ``".4f"``).
        scale: multiplies numeric values first (100 for percentages).
        suffix: appended to every formatted value (e.g. ``"%"``).
        missing: printed for ``None`` or an absent key.
        align: ``">"`` (numbers) or ``"<"`` (labels).
    """

    header: str
    value: str | Callable[[Row], Any]
    spec: str = ""
    scale: float = 1.0
    suffix: str = ""
    missing: str = "-"
    align: str = ">"

    def cell(self, row: Row) -> str:
        """The formatted value of ``row`` in this column."""
        value = self.value(row) if callable(self.value) else row.get(self.value)
        if value is None:
            return self.missing
        if self.scale != 1.0 and isinstance(value, int | float):
            value = self.scale * value
        return f"{value:{self.spec}}{self.suffix}"


def percent(header: str, value: str | Callable[[Row], Any], digits: int = 2) -> Column:
    """A fraction shown in percent with ``digits`` decimals."""
    return Column(header, value, f".{digits}f", scale=100.0, suffix="%")


def format_table(rows: Sequence[Row], columns: Sequence[Column], *, title: str = "") -> str:
    """Rows under a header and a rule, columns two spaces apart (``title`` above, if any)."""
    cells = [[c.cell(r) for c in columns] for r in rows]
    widths = [
        max([len(c.header), *(len(line[i]) for line in cells)]) for i, c in enumerate(columns)
    ]

    def line(texts: Sequence[str]) -> str:
        parts = (f"{t:{c.align}{w}}" for t, c, w in zip(texts, columns, widths, strict=True))
        return "  ".join(parts).rstrip()

    header = line([c.header for c in columns])
    out = [title] if title else []
    out += [header, "-" * len(header), *(line(texts) for texts in cells)]
    return "\n".join(out)
