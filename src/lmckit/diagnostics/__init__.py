"""Diagnostics: why (or why not) two networks connect linearly.

* neuron identifiability: the input subspace and its coherence, Gram anisotropy,
  realization and swap costs, center gaps (Boehm et al.);
* the activation-matching objective of identity vs optimal vs random permutations, and
  how far a path's activations leave the chord between its ends;
* width-expansion mechanisms: effective rank, LEWC cosine, weak additivity, reciprocal
  orthogonality;
* representation similarity along paths (linear CKA) and curvature (the top Hessian
  eigenvalue at points of a path).
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.diagnostics._curvature import path_top_eigenvalues, top_hessian_eigenvalue
    from lmckit.diagnostics._identifiability import (
        center_gaps,
        coherence,
        gram_anisotropy,
        input_subspace,
        realization_cost,
        swap_costs,
    )
    from lmckit.diagnostics._neuron_function import (
        activation_matching_objectives,
        chord_deviation,
    )
    from lmckit.diagnostics._similarity import linear_cka, path_cka
    from lmckit.diagnostics._width import (
        effective_rank,
        lewc_cosine,
        reciprocal_orthogonality,
        weak_additivity,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
