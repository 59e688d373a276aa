"""Permutation-free LMC of wide networks, its mechanisms, and curved paths (MNIST).

Reproduces arXiv 2510.08023 ("Do We Really Need Permutations?") on CPU scale and
Garipov et al. 2018 (trained Bezier curves):

- ``width-sweep``: merged accuracy and loss barrier vs width, no permutation vs weight
  matching, weight decay 3e-3 vs 1e-4, every path point temperature-calibrated (:mod:`.mlp`).
- ``width-sweep-vgg`` / ``width-sweep-resnet20``: the same for BatchNorm CNNs (a
  3-conv VGG-style net and ResNet20), BatchNorm statistics reset at every path point
  (:mod:`.cnn`).
- ``weight-decay``: LEWC cosine, weak additivity, reciprocal orthogonality and effective
  rank per layer vs weight decay at the widest width (:mod:`.mlp`).
- ``bezier``: linear vs trained quadratic-Bezier (and chain) barrier between two
  unaligned MLPs, with CKA and top Hessian eigenvalue along both paths (:mod:`.bezier`).

Data: MNIST's t10k images, first 8000 train, last 2000 test (subsets in the quick modes
and the CNN sweeps); the inverse temperature is fitted on the first 20 % of the test
split and every reported metric is on the remaining 80 %.
"""

from lmckit.experiments._width.bezier import BEZIER_CURVE, BEZIER_TRAIN
from lmckit.experiments._width.cnn import CNN_SWEEPS, VGG_LAYOUT, CNNSweep
from lmckit.experiments._width.common import BASE_WIDTH, DEPTH, MULTIPLIERS, WEIGHT_DECAYS
from lmckit.experiments._width.mlp import WidthSettings

__all__ = [
    "BASE_WIDTH",
    "BEZIER_CURVE",
    "BEZIER_TRAIN",
    "CNN_SWEEPS",
    "DEPTH",
    "MULTIPLIERS",
    "VGG_LAYOUT",
    "WEIGHT_DECAYS",
    "CNNSweep",
    "WidthSettings",
]
