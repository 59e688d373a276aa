"""Aligners: each returns an :class:`AlignmentResult` whose transform aligns B to A."""

from lmckit.align.activation import (
    activation_matching,
    collect_cross_statistics,
    orthogonal_activation_matching,
)
from lmckit.align.head_bases import (
    HeadBases,
    align_head_bases,
    apply_head_bases,
    match_head_bases,
)
from lmckit.align.learned import LearnedMatchingConfig, learned_matching
from lmckit.align.multi import UniverseConfig, UniverseResult, universe_matching
from lmckit.align.result import AlignmentResult, SpaceDiagnostics
from lmckit.align.solvers import solve
from lmckit.align.weight import WeightMatchingConfig, weight_matching
from lmckit.align.width import (
    PaddedPermutation,
    WidthMatchingConfig,
    naive_embedding,
    width_matching,
)

__all__ = [
    "AlignmentResult",
    "HeadBases",
    "LearnedMatchingConfig",
    "PaddedPermutation",
    "SpaceDiagnostics",
    "UniverseConfig",
    "UniverseResult",
    "WeightMatchingConfig",
    "WidthMatchingConfig",
    "activation_matching",
    "align_head_bases",
    "apply_head_bases",
    "collect_cross_statistics",
    "learned_matching",
    "match_head_bases",
    "naive_embedding",
    "orthogonal_activation_matching",
    "solve",
    "universe_matching",
    "weight_matching",
    "width_matching",
]
