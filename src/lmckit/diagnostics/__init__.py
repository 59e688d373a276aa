"""Diagnostics: why (or why not) two networks connect linearly.

Import from the modules (one concept each):

* :mod:`lmckit.diagnostics.identifiability`: neuron identifiability (input subspace,
  coherence, Gram anisotropy, realization and swap costs, center gaps; re-exports the
  next module's names).
* :mod:`lmckit.diagnostics.neuron_function`: activation-matching objective of identity vs
  optimal vs random permutations, chord deviation along a path.
* :mod:`lmckit.diagnostics.width`, :mod:`lmckit.diagnostics.similarity`,
  :mod:`lmckit.diagnostics.curvature`, :mod:`lmckit.diagnostics.features`: width-expansion
  mechanisms, CKA along paths, Hessian curvature, module features.
"""
