"""Aligners: each returns an :class:`AlignmentResult` whose transform aligns B to A."""

from lmckit.align.activation import activation_matching, collect_cross_statistics
from lmckit.align.result import AlignmentResult, SpaceDiagnostics
from lmckit.align.solvers import solve
from lmckit.align.weight import WeightMatchingConfig, weight_matching

__all__ = [
    "AlignmentResult",
    "SpaceDiagnostics",
    "WeightMatchingConfig",
    "activation_matching",
    "collect_cross_statistics",
    "solve",
    "weight_matching",
]
