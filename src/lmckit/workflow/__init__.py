"""Whole tasks, one call each: train, align a pair, merge, a simplex, curves and planes.

Each function takes loaded models and data and returns results; none reads or writes
files but the two that write and read a curve folder (:func:`save_curve`,
:func:`load_curve`: its points are models in their own format). The command line is a
thin layer over them (parse, validate, call one of these, write), and the experiments
and library users get the same behaviour. One module per task:
:mod:`~lmckit.workflow._train`, :mod:`~lmckit.workflow._pair` (a merged point, a pair's
barrier, a simplex), :mod:`~lmckit.workflow._curves` (fit, write and read a curve),
:mod:`~lmckit.workflow._landscape` (a plane through three models, a curve ensemble),
:mod:`~lmckit.workflow._soup`, :mod:`~lmckit.workflow._symmetries` (what a model would be
aligned under). Aligning a pair is :mod:`lmckit.plan` (plan, describe, run on B, write).
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.workflow._curves import fit_pair_curve, load_curve
    from lmckit.workflow._landscape import curve_ensemble, pair_landscape
    from lmckit.workflow._pair import merge_pair, pair_barrier
    from lmckit.workflow._simplex import simplex_barrier
    from lmckit.workflow._soup import make_soup
    from lmckit.workflow._symmetries import describe_symmetries
    from lmckit.workflow._train import train_model

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
