"""Paths between parameter sets beyond the straight line."""

from lmckit.paths.curves import (
    CURVE_KINDS,
    Curve,
    curve_point,
    evaluate_curve,
    fit_curve,
    linear_init,
)
from lmckit.paths.simplex import SimplexResult, evaluate_simplex, simplex_grid

__all__ = [
    "CURVE_KINDS",
    "Curve",
    "SimplexResult",
    "curve_point",
    "evaluate_curve",
    "evaluate_simplex",
    "fit_curve",
    "linear_init",
    "simplex_grid",
]
