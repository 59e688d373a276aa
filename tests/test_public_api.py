"""The public API: at most 200 names, every one importable, and docs/api.md current."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import public_api  # noqa: E402


def test_the_public_surface_is_small_and_every_name_resolves() -> None:
    modules = public_api.public_modules()
    names = set()
    for module in modules:
        mod = importlib.import_module(module)
        for name in public_api.public_names(module):
            assert getattr(mod, name) is not None, f"{module}.{name}"
            names.add(name)
    assert len(names) <= 200
    # implementation lives in private modules: no public module but the packages' own
    # __init__ and the command line's entry exposes names
    assert all(importlib.import_module(m).__file__.endswith("__init__.py") for m in modules)


def test_the_api_page_lists_exactly_the_public_names() -> None:
    assert (ROOT / "docs" / "api.md").read_text() == public_api.page()


def test_importing_lmckit_imports_no_torch() -> None:
    # the public names are imported on first use: the command line starts fast
    code = "import sys, lmckit, lmckit.symmetry, lmckit.forms; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
