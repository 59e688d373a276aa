"""The transformer recipe as the experiments reach it: one function, one place to switch.

LayerNorm -> RMSNorm (the residual stream becomes orthogonal), then optionally every
attention head as its QK and OV circuit. Both rewrites are exact. The library is getting
one entry point for this recipe (:mod:`lmckit.recipe`); every experiment calls
:func:`transformer_form` instead of :mod:`lmckit.rewrites` directly, so that moving to it
changes this function alone.
"""

from __future__ import annotations

from lmckit.models import ZooModel
from lmckit.params import Params
from lmckit.rewrites import heads_to_circuits, layernorm_to_rmsnorm

__all__ = ["transformer_form"]


def transformer_form(
    module: ZooModel, params: Params, *, circuits: bool = False
) -> tuple[ZooModel, Params]:
    """``(module, params)`` in RMSNorm form, with heads as circuits when ``circuits``.

    A model already in RMSNorm form (e.g. embedded into a wider one) is not rewritten
    again; the result computes the same function as the input.
    """
    if getattr(module, "norm", None) == "layer":
        module, params = layernorm_to_rmsnorm(module, params)
    if circuits:
        module, params = heads_to_circuits(module, params)
    return module, params
