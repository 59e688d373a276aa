"""Aligners: each returns an :class:`AlignmentResult` whose transform aligns B to A.

Every aligner has one signature (see :mod:`lmckit.aligners.registry`) and is registered
by name: ``get_aligner("weight_matching")(spec, params_a, params_b)``.
"""

from lmckit.aligners.activation import (
    ActivationMatchingConfig,
    activation_matching,
    collect_cross_statistics,
)
from lmckit.aligners.head_bases import (
    HeadBases,
    HeadBasesResult,
    align_head_bases,
    apply_head_bases,
    head_bases_matching,
    match_head_bases,
)
from lmckit.aligners.learned import LearnedMatchingConfig, learned_matching
from lmckit.aligners.multi import UniverseConfig, UniverseResult, universe_matching
from lmckit.aligners.naive import naive
from lmckit.aligners.registry import (
    Aligner,
    AlignerInfo,
    aligner_info,
    get_aligner,
    list_aligners,
    register_aligner,
)
from lmckit.aligners.result import AlignmentResult, SpaceDiagnostics
from lmckit.aligners.run import AlignRun
from lmckit.aligners.solvers import solve
from lmckit.aligners.weight import WeightMatchingConfig, weight_matching
from lmckit.aligners.width import (
    PaddedPermutation,
    WidthMatchingConfig,
    naive_embedding,
    width_matching,
)

__all__ = [
    "ActivationMatchingConfig",
    "Aligner",
    "AlignRun",
    "AlignerInfo",
    "AlignmentResult",
    "HeadBases",
    "HeadBasesResult",
    "LearnedMatchingConfig",
    "PaddedPermutation",
    "SpaceDiagnostics",
    "UniverseConfig",
    "UniverseResult",
    "WeightMatchingConfig",
    "WidthMatchingConfig",
    "activation_matching",
    "align_head_bases",
    "aligner_info",
    "apply_head_bases",
    "collect_cross_statistics",
    "get_aligner",
    "head_bases_matching",
    "learned_matching",
    "list_aligners",
    "match_head_bases",
    "naive",
    "naive_embedding",
    "register_aligner",
    "solve",
    "universe_matching",
    "weight_matching",
    "width_matching",
]
