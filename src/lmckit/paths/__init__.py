"""Paths between parameter sets beyond the straight line: curves, elastic bands, simplices,
planes through three models, and ensembles of points along a curve."""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.paths._curves import CURVE_KINDS, Curve, curve_point, evaluate_curve, fit_curve
    from lmckit.paths._ensemble import EnsembleResult, ensemble_metrics
    from lmckit.paths._neb import Band, BandConfig, fit_band
    from lmckit.paths._plane import PlaneFrame, PlaneResult, evaluate_plane, plane_frame
    from lmckit.paths._simplex import SimplexResult, evaluate_simplex, simplex_grid

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
