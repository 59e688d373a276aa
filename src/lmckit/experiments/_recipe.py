"""The transformer recipe as the experiments reach it: one function, one place to switch.

The form with an orthogonal residual stream (LayerNorm -> RMSNorm for lmckit's
transformers), then optionally every attention head as its QK and OV circuit, through
the library's one entry point, :func:`lmckit.forms.aligned_form`. Both rewrites are
exact.
"""

from __future__ import annotations

from lmckit.forms._recipe import aligned_form
from lmckit.models import ZooModel
from lmckit.symmetry._params import Params

__all__ = ["transformer_form"]


def transformer_form(
    module: ZooModel, params: Params, *, circuits: bool = False
) -> tuple[ZooModel, Params]:
    """``(module, params)`` in RMSNorm form, with heads as circuits when ``circuits``.

    A model already in RMSNorm form (e.g. embedded into a wider one) is not rewritten
    again; the result computes the same function as the input.
    """
    form = aligned_form(module, params, params, symmetry="orthogonal", circuits=circuits)
    assert isinstance(form.module, ZooModel)
    return form.module, dict(form.a)
