"""Weight matching: data-free alignment by the models' weights alone.

:func:`weight_matching` (:mod:`~lmckit.aligners._weight.matching`) is the aligner; the
other modules are its parts: the per-space similarity (:mod:`.similarity`), attention
circuits (:mod:`.circuits`), the similarity cache kept across updates
(:mod:`.incremental`), the anchored start (:mod:`.anchored`), the data-driven choice
between starts (:mod:`.start_choice`) and the objective's bookkeeping (:mod:`.objective`).
"""

from lmckit.aligners._weight.matching import (
    GIT_REBASIN,
    START_OPTIONS,
    WeightMatchingConfig,
    space_objective,
    space_similarity,
    space_widths,
    weight_matching,
)

__all__ = [
    "GIT_REBASIN",
    "START_OPTIONS",
    "WeightMatchingConfig",
    "space_objective",
    "space_similarity",
    "space_widths",
    "weight_matching",
]
