"""lmckit's public API: every public module, its names, and docs/api.md written from them.

A module is public when no part of its dotted name starts with an underscore; its public
names are its ``__all__``. Everything else is implementation, free to change.

Run: ``python scripts/public_api.py`` (prints the count and the names per module),
``--write`` (rewrites ``docs/api.md``), ``--check`` (exits 1 when ``docs/api.md`` is
out of date).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "api.md"

HEADER = """# The public API

What `import lmckit` offers, package by package: every name here is kept stable; a module or
name with a leading underscore is lmckit's implementation and may change. This page is
written by `python scripts/public_api.py --write` from the packages' `__all__` (a test
checks it is current).

"""


def public_modules() -> list[str]:
    """Dotted names of lmckit's public modules, packages first then their modules."""
    import lmckit

    names = ["lmckit"]
    for info in pkgutil.walk_packages(lmckit.__path__, "lmckit."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def public_names(module: str) -> list[str]:
    return list(getattr(importlib.import_module(module), "__all__", []))


def summary(obj: object) -> str:
    """The first paragraph of ``obj``'s docstring, on one line (a type alias or a
    constant: what it is)."""
    if isinstance(obj, types.GenericAlias) or getattr(obj, "__origin__", None) is not None:
        return f"type alias: `{obj}`".replace("torch.Tensor", "Tensor")
    if not (inspect.isclass(obj) or callable(obj) or inspect.ismodule(obj)):
        shown = repr(sorted(obj) if isinstance(obj, dict) else obj)
        return f"constant: `{shown if len(shown) <= 80 else shown[:77] + '...'}`"
    doc = getattr(obj, "help", None) or inspect.getdoc(obj) or ""  # a click command: its help
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def page() -> str:
    out = [HEADER]
    for module in public_modules():
        names = public_names(module)
        if not names:
            continue
        mod = importlib.import_module(module)
        out.append(f"## `{module}`\n\n{summary(mod)}\n\n| name | what it is |\n|---|---|\n")
        for name in sorted(names):
            text = summary(getattr(mod, name)).replace("|", "\\|")
            out.append(f"| `{name}` | {text} |\n")
        out.append("\n")
    return "".join(out).rstrip("\n") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/api.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = parser.parse_args()
    modules = public_modules()
    distinct = {n for m in modules for n in public_names(m)}
    if args.write:
        API_PAGE.write_text(page())
    elif args.check:
        return 0 if API_PAGE.read_text() == page() else 1
    else:
        print(f"{len(distinct)} distinct public names in {len(modules)} public modules")
        for module in modules:
            names = public_names(module)
            if names:
                print(f"  {module} ({len(names)}): {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
