"""Whole tasks, one call each: train, align a pair, merge, compare methods, a simplex.

Each function takes loaded models and data and returns results; none reads or writes
files. The command line is a thin layer over them (parse, validate, call one of these,
write), and the experiments and library users get the same behaviour. One module per
task: :mod:`~lmckit.workflow.train`, :mod:`~lmckit.workflow.align` (a pair, a comparison
of methods, the whole recipe on loaded models), :mod:`~lmckit.workflow.paths` (a merged
point, a pair's barrier, a simplex).
"""

from lmckit.workflow.align import (
    ALIGN_METHODS,
    METHODS,
    AlignedPair,
    align_models,
    align_output_kind,
    align_pair,
    compare_alignments,
)
from lmckit.workflow.paths import MERGE_FIXES, merge_pair, pair_barrier, simplex_barrier
from lmckit.workflow.train import TrainedModel, train_model

__all__ = [
    "ALIGN_METHODS",
    "METHODS",
    "MERGE_FIXES",
    "AlignedPair",
    "TrainedModel",
    "align_models",
    "align_output_kind",
    "align_pair",
    "compare_alignments",
    "merge_pair",
    "pair_barrier",
    "simplex_barrier",
    "train_model",
]
