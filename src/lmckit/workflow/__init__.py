"""Whole tasks, one call each: train, align a pair, merge, a simplex.

Each function takes loaded models and data and returns results; none reads or writes
files. The command line is a thin layer over them (parse, validate, call one of these,
write), and the experiments and library users get the same behaviour. One module per
task: :mod:`~lmckit.workflow.train`, :mod:`~lmckit.workflow.align` (the whole recipe on
two loaded models), :mod:`~lmckit.workflow.pair` (a merged
point, a pair's barrier, a simplex), :mod:`~lmckit.workflow.symmetries` (what a model
would be aligned under).
"""

from lmckit.workflow.align import (
    ALIGN_METHODS,
    AlignedPair,
    align_models,
    align_output_kind,
    choose_pair_form,
    convertible,
    model_in_form,
    pair_form,
)
from lmckit.workflow.pair import (
    MERGE_FIXES,
    PathForm,
    merge_pair,
    pair_barrier,
    path_form,
    recorded_form,
    simplex_barrier,
)
from lmckit.workflow.symmetries import SpaceSummary, SymmetryReport, describe_symmetries
from lmckit.workflow.train import TrainedModel, train_model

__all__ = [
    "ALIGN_METHODS",
    "MERGE_FIXES",
    "AlignedPair",
    "PathForm",
    "SpaceSummary",
    "SymmetryReport",
    "TrainedModel",
    "align_models",
    "align_output_kind",
    "choose_pair_form",
    "convertible",
    "describe_symmetries",
    "merge_pair",
    "model_in_form",
    "pair_form",
    "pair_barrier",
    "path_form",
    "recorded_form",
    "simplex_barrier",
    "train_model",
]
