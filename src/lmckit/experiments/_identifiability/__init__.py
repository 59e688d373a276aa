"""Neuron identifiability experiments (Boehm et al., "Beyond structural symmetries", §6).

* ``asym-lmc`` (Q1, Fig. 4) and ``kappa-sweep`` (Q2, Fig. 3): MNIST MLPs (:mod:`.mnist`).
* ``swap-costs`` (Q3, Fig. 5): swap-cost matrices of the first layer of W-asymmetric
  MLPs on Gaussian mixtures of intrinsic dimension 2, 8, 32 (:mod:`.swap_costs`).
* ``coherence`` (Q4, Fig. 6): midpoint barrier of a one-hidden-layer W-asymmetric
  student against the coherence of its input embedding (:mod:`.coherence`).

Every asymmetric model is folded by
:func:`lmckit.experiments._identifiability._asymmetric.to_plain` before alignment or path
evaluation (the fold commutes with interpolation, see there).
"""

from lmckit.experiments._identifiability.coherence import FAMILIES, coherence_embedding
from lmckit.experiments._identifiability.common import trained_plain_pair
from lmckit.experiments._identifiability.mnist import MNIST_FULL, MNIST_QUICK, MnistSetup
from lmckit.experiments._identifiability.swap_costs import swap_cost_summary

__all__ = [
    "FAMILIES",
    "MNIST_FULL",
    "MNIST_QUICK",
    "MnistSetup",
    "coherence_embedding",
    "swap_cost_summary",
    "trained_plain_pair",
]
