"""Whole tasks, one call each: train, align a pair, merge, a simplex.

Each function takes loaded models and data and returns results; none reads or writes
files. The command line is a thin layer over them (parse, validate, call one of these,
write), and the experiments and library users get the same behaviour. One module per
task: :mod:`~lmckit.workflow.train`, :mod:`~lmckit.workflow.pair` (a merged point, a
pair's barrier, a simplex), :mod:`~lmckit.workflow.symmetries` (what a model would be
aligned under). Aligning a pair is :mod:`lmckit.plan` (plan, describe, run on B, write).
"""

from lmckit.measure import MERGE_FIXES
from lmckit.workflow.pair import (
    PathForm,
    check_simplex_request,
    merge_pair,
    pair_barrier,
    path_form,
    recorded_form,
    simplex_barrier,
    written_point,
)
from lmckit.workflow.symmetries import SpaceSummary, SymmetryReport, describe_symmetries
from lmckit.workflow.train import TrainedModel, train_model

__all__ = [
    "MERGE_FIXES",
    "PathForm",
    "SpaceSummary",
    "SymmetryReport",
    "TrainedModel",
    "check_simplex_request",
    "describe_symmetries",
    "merge_pair",
    "pair_barrier",
    "path_form",
    "recorded_form",
    "simplex_barrier",
    "train_model",
    "written_point",
]
