"""Loss and accuracy along paths between models, and the results' tables, JSON and plots.

:func:`evaluate_path` runs every point of a path through one module
(``functional_call``); :func:`measure_path` does it for a pair on a dataset with
lmckit's rules (split, batch size, BatchNorm fix); :class:`PathResult` holds ``t``,
loss, accuracy and the barriers.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.measure._evaluate import PathResult, evaluate, evaluate_path
    from lmckit.measure._measure import EvalSettings, measure_path
    from lmckit.measure._plot import plot_paths, plot_planes, plot_simplex

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
