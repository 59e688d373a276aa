"""Aligners: each returns an :class:`AlignmentResult` whose transform aligns B to A.

Every aligner has one signature (see :mod:`lmckit.aligners._registry`) and is registered
by name: ``get_aligner("weight_matching")(spec, params_a, params_b)``.
"""

from lmckit.aligners._activation import ActivationMatchingConfig, activation_matching
from lmckit.aligners._head_bases import head_bases_matching
from lmckit.aligners._learned import LearnedMatchingConfig, learned_matching
from lmckit.aligners._multi import UniverseConfig, UniverseResult, universe_matching
from lmckit.aligners._naive import naive
from lmckit.aligners._registry import (
    AlignerInfo,
    aligner_info,
    get_aligner,
    list_aligners,
    register_aligner,
)
from lmckit.aligners._result import AlignmentResult, SpaceDiagnostics
from lmckit.aligners._run import AlignRun
from lmckit.aligners._weight import WeightMatchingConfig, weight_matching
from lmckit.aligners._width import WidthMatchingConfig, width_matching

__all__ = [
    "ActivationMatchingConfig",
    "AlignRun",
    "AlignerInfo",
    "AlignmentResult",
    "LearnedMatchingConfig",
    "SpaceDiagnostics",
    "UniverseConfig",
    "UniverseResult",
    "WeightMatchingConfig",
    "WidthMatchingConfig",
    "activation_matching",
    "aligner_info",
    "get_aligner",
    "head_bases_matching",
    "learned_matching",
    "list_aligners",
    "naive",
    "register_aligner",
    "universe_matching",
    "weight_matching",
    "width_matching",
]
