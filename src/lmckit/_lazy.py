"""Public names of a package, imported on first use (PEP 562).

A package's ``__init__`` lists its public names as imports under ``TYPE_CHECKING`` (what
type checkers and editors read); :func:`lazy_exports` reads the same imports at run
time, so importing the package imports nothing else until a name is used, and no
package's import waits on another's (the implementation modules import one another
directly, never through a package's public names).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["lazy_exports"]


def _exports(init_file: str) -> dict[str, str]:
    """Public name -> defining module, from the ``TYPE_CHECKING`` imports of ``init_file``."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    exports: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for item in node.body:
                if isinstance(item, ast.ImportFrom):
                    for alias in item.names:
                        exports[alias.asname or alias.name] = str(item.module)
    return exports


def lazy_exports(
    package: str, init_file: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for the package ``package`` whose ``__init__``
    is ``init_file``."""
    exports = _exports(init_file)
    names = sorted(exports)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)  # later lookups skip this
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__, names
