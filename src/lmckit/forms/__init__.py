"""The form two models are aligned and measured in: exact rewrites, and which form by default.

:func:`aligned_form` puts a pair in a form (norm scales folded into their readers, the
LayerNorm -> RMSNorm rewrite, attention heads as QK/OV circuits); :data:`FORMS` and
:func:`choose_form` say which form a method and symmetry use by default, measured.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.forms._choice import (
        FORMS,
        Form,
        FormChoice,
        choose_form,
    )
    from lmckit.forms._recipe import SYMMETRIES, aligned_form
    from lmckit.forms._rewrites import heads_to_circuits, layernorm_to_rmsnorm
    from lmckit.forms._steps import AlignForm, Rewrite
    from lmckit.forms._widen import embed_in_wider

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
