"""Whole tasks, one call each: train, align a pair, merge, a simplex, curves and planes.

Each function takes loaded models and data and returns results; none reads or writes
files but the two that write and read a curve folder (:func:`save_curve`,
:func:`load_curve`: its points are models in their own format). The command line is a
thin layer over them (parse, validate, call one of these, write), and the experiments
and library users get the same behaviour. One module per task:
:mod:`~lmckit.workflow.train`, :mod:`~lmckit.workflow.align` (the whole recipe on two
loaded models), :mod:`~lmckit.workflow.pair` (a merged point, a pair's barrier, a
simplex), :mod:`~lmckit.workflow.curves` (fit, write and read a curve),
:mod:`~lmckit.workflow.landscape` (a plane through three models, a curve ensemble),
:mod:`~lmckit.workflow.soup`, :mod:`~lmckit.workflow.symmetries` (what a model would be
aligned under).
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
from lmckit.workflow.curves import (
    CurveSettings,
    FittedCurve,
    LoadedCurve,
    fit_pair_curve,
    load_curve,
    save_curve,
)
from lmckit.workflow.landscape import curve_ensemble, pair_landscape, plane_inputs
from lmckit.workflow.pair import (
    MERGE_FIXES,
    PathForm,
    merge_pair,
    pair_barrier,
    path_form,
    recorded_form,
    simplex_barrier,
)
from lmckit.workflow.soup import SoupResult, make_soup
from lmckit.workflow.symmetries import SpaceSummary, SymmetryReport, describe_symmetries
from lmckit.workflow.train import TrainedModel, train_model

__all__ = [
    "ALIGN_METHODS",
    "MERGE_FIXES",
    "AlignedPair",
    "CurveSettings",
    "FittedCurve",
    "LoadedCurve",
    "PathForm",
    "SoupResult",
    "SpaceSummary",
    "SymmetryReport",
    "TrainedModel",
    "align_models",
    "align_output_kind",
    "choose_pair_form",
    "convertible",
    "curve_ensemble",
    "describe_symmetries",
    "fit_pair_curve",
    "load_curve",
    "make_soup",
    "merge_pair",
    "model_in_form",
    "pair_form",
    "pair_barrier",
    "pair_landscape",
    "path_form",
    "plane_inputs",
    "recorded_form",
    "save_curve",
    "simplex_barrier",
    "train_model",
]
