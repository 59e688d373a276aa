"""Rows of experiment tables: a path result as one JSON row.

The tables themselves are :mod:`lmckit.measure._table`'s (``Column``, ``percent``,
``format_table``).
"""

from __future__ import annotations

from typing import Any

from lmckit.measure._evaluate import PathResult

__all__ = ["path_row"]


def path_row(label: str, result: PathResult, *, key: str = "method", **extra: Any) -> dict:
    """A JSON row of one path: ``{key: label}``, the path's JSON form, then ``extra``."""
    return {key: label, **result.to_dict(), **extra}
