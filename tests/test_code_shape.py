"""The code's shape (developers' guide): no function body over 60 lines after its
docstring, no module over 400 lines; measured by ``scripts/code_shape.py``."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import code_shape  # noqa: E402


def test_no_function_body_over_60_lines_and_no_module_over_400() -> None:
    found = code_shape.oversized()
    assert not found, "over the limits:\n" + "\n".join(map(str, found))


def test_a_body_is_counted_after_its_docstring(tmp_path: Path) -> None:
    statements = "\n".join(f"    x{i} = {i}" for i in range(61))
    docstring = '    """A docstring\n    over\n    three lines."""\n'
    (tmp_path / "long.py").write_text(f"def long():\n{docstring}{statements}\n")
    (tmp_path / "short.py").write_text(f"def short():\n{docstring}" + statements[:-10] + "\n")
    found = code_shape.oversized(tmp_path)
    assert [(o.path.name, o.name, o.length) for o in found] == [("long.py", "long", 61)]
    node = ast.parse((tmp_path / "short.py").read_text()).body[0]
    assert isinstance(node, ast.FunctionDef) and code_shape.body_length(node) == 60


def test_a_module_over_400_lines_is_named(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text("x = 0\n" * 401)
    (tmp_path / "fits.py").write_text("x = 0\n" * 400)
    found = code_shape.oversized(tmp_path)
    assert [(o.path.name, o.name, o.length) for o in found] == [("big.py", "(module)", 401)]
