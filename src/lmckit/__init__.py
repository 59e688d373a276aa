"""lmckit: align, merge and measure linear mode connectivity between neural networks.

The names below are imported on first use (PEP 562): ``import lmckit`` itself is
instant, so the command line starts without loading PyTorch until a command needs it
(and an interrupt during start-up is handled like any other).
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # The one table of public names: type checkers and editors read these imports, and
    # at run time ``_EXPORTS`` and ``__all__`` are read from them (nothing is imported
    # until a name is first used).
    from lmckit.aligned import Aligned, align
    from lmckit.checkpoint import CheckpointError, save
    from lmckit.evaluate import PathResult, evaluate, evaluate_path
    from lmckit.io import load, load_model, save_model
    from lmckit.loaded import LoadedModel
    from lmckit.params import (
        Params,
        check_compatible,
        interpolate,
        module_params,
        weighted_average,
    )
    from lmckit.recipe import AlignForm, aligned_form
    from lmckit.spec import (
        SpecCheckError,
        SpecInferenceError,
        SymmetryAnalysis,
        analyze_symmetries,
        check_spec,
        infer_spec,
    )
    from lmckit.symmetry import (
        HeadPermutation,
        Invertible,
        Orthogonal,
        Permutation,
        SemiPermutation,
        Space,
        SymmetrySpec,
        Transform,
        Use,
        apply,
        random_transform,
    )
    from lmckit.task import Task, classification, mse


def _exports() -> dict[str, str]:
    """Public name -> the module that defines it, read from the imports above."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    return {
        alias.asname or alias.name: str(node.module)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


_EXPORTS = _exports()
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lmckit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """The package, whose public names win over its submodules of the same name.

    Importing the submodule ``lmckit.evaluate`` (which any other import may do first)
    makes Python set the package's attribute ``evaluate`` to that module, hiding the
    function ``lmckit.evaluate`` that ``__all__`` promises; that one assignment is
    dropped, so the name keeps resolving through ``__getattr__`` to the function.
    ``from lmckit.evaluate import ...`` is unaffected (it reads ``sys.modules``);
    ``import lmckit.evaluate as m`` gives the function too.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            if _EXPORTS.get(name) == value.__name__ and name in __all__:
                return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
