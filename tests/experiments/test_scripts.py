"""Research scripts stay outside the package: they import lmckit's library, never experiments."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("*.py")), ids=lambda p: p.name)
def test_scripts_import_only_the_library(script: Path) -> None:
    lmckit = {name for name in _imports(script) if name.split(".")[0] == "lmckit"}
    assert lmckit, f"{script.name} does not use lmckit"
    assert not {name for name in lmckit if name.startswith("lmckit.experiments")}


def test_gpt2_wm_variants_refuses_a_missing_run_folder(tmp_path: Path) -> None:
    script = SCRIPTS / "gpt2_wm_variants.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--config", "quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert f"expected one run folder {tmp_path}/quick-*" in done.stderr
