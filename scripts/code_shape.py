"""lmckit's code shape: no function body over 60 lines, no module over 400 lines.

A function's body is counted after its docstring, from its first statement to its last
line (nested functions count inside the function that holds them, and on their own).
A module's length is its number of lines. Pure ``ast``: nothing is imported.

Run: ``python scripts/code_shape.py`` (prints every function and module over the limits;
exits 1 when there is one). ``tests/test_code_shape.py`` asserts there is none.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import lmckit

#: the package measured: the one Python imports (this checkout's, installed editable)
SOURCE = Path(lmckit.__file__).resolve().parent
ROOT = SOURCE.parents[1]

#: The longest function body allowed, in lines after the docstring.
MAX_BODY = 60
#: The longest module allowed, in lines.
MAX_MODULE = 400


@dataclass(frozen=True)
class Oversized:
    """A function or module over its limit: where it is, what it is and how long."""

    path: Path
    line: int
    name: str
    length: int
    limit: int

    def __str__(self) -> str:
        try:
            where = self.path.relative_to(ROOT)
        except ValueError:
            where = self.path
        return f"{self.length:5d} > {self.limit}  {where}:{self.line} {self.name}"


def _has_docstring(body: list[ast.stmt]) -> bool:
    first = body[0] if body else None
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )


def body_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the function's first statement after its docstring to its last line
    (a function that is only a docstring counts the docstring)."""
    body = node.body[1:] if _has_docstring(node.body) and len(node.body) > 1 else node.body
    assert node.end_lineno is not None
    return node.end_lineno - body[0].lineno + 1


def oversized(root: Path = SOURCE) -> list[Oversized]:
    """Every function with a body over :data:`MAX_BODY` lines and every module over
    :data:`MAX_MODULE` lines under ``root``, longest first."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE:
            found.append(Oversized(path, 1, "(module)", lines, MAX_MODULE))
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = body_length(node)
                if length > MAX_BODY:
                    found.append(Oversized(path, node.lineno, node.name, length, MAX_BODY))
    return sorted(found, key=lambda o: (-o.length, str(o.path), o.line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=SOURCE, help="source folder")
    args = parser.parse_args(argv)
    found = oversized(args.root)
    for entry in found:
        print(entry)
    print(f"{len(found)} over the limits (function body {MAX_BODY}, module {MAX_MODULE})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
