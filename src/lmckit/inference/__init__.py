"""Symmetry discovery and verification for any module (see :mod:`lmckit.inference._infer`).

* :func:`infer_spec` / :func:`analyze_symmetries`: the spec of a module from its traced
  graph (permutations, attention heads, grouped-query heads, orthogonal residual
  streams), verified before it is returned;
* :func:`check_spec`: verify any spec (inferred or hand-written) on a module.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.inference._check import SpecCheckError, check_spec
    from lmckit.inference._infer import SymmetryAnalysis, analyze_symmetries, infer_spec
    from lmckit.inference._trace import SpecInferenceError

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
