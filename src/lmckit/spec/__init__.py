"""Symmetry discovery and verification for any module (see :mod:`lmckit.spec.infer`).

* :func:`infer_spec` / :func:`analyze_symmetries`: the spec of a module from its traced
  graph (permutations, attention heads, grouped-query heads, orthogonal residual
  streams), verified before it is returned;
* :func:`check_spec`: verify any spec (inferred or hand-written) on a module.
"""

from lmckit.spec.check import SpecCheckError, check_spec
from lmckit.spec.infer import SymmetryAnalysis, analyze_symmetries, infer_spec
from lmckit.spec.trace import SpecInferenceError

__all__ = [
    "SpecCheckError",
    "SpecInferenceError",
    "SymmetryAnalysis",
    "analyze_symmetries",
    "check_spec",
    "infer_spec",
]
