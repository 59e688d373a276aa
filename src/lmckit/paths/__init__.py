"""Paths between parameter sets beyond the straight line: curves, elastic bands, simplices,
planes through three models, and ensembles of points along a curve."""

from lmckit.paths.curves import (
    CURVE_KINDS,
    Curve,
    CurveLike,
    curve_point,
    evaluate_curve,
    fit_curve,
    linear_init,
)
from lmckit.paths.ensemble import EnsembleResult, ensemble_metrics
from lmckit.paths.neb import Band, BandConfig, fit_band
from lmckit.paths.plane import PlaneFrame, PlaneResult, evaluate_plane, plane_axes, plane_frame
from lmckit.paths.simplex import SimplexResult, evaluate_simplex, simplex_grid

__all__ = [
    "CURVE_KINDS",
    "Band",
    "BandConfig",
    "Curve",
    "CurveLike",
    "EnsembleResult",
    "PlaneFrame",
    "PlaneResult",
    "SimplexResult",
    "curve_point",
    "ensemble_metrics",
    "evaluate_curve",
    "evaluate_plane",
    "evaluate_simplex",
    "fit_band",
    "fit_curve",
    "linear_init",
    "plane_axes",
    "plane_frame",
    "simplex_grid",
]
