"""Models in and out, in the format they came in: one loader, one model type, one writer.

:func:`load` reads an lmckit checkpoint, a Hugging Face folder or a file of parameters
(with the module it belongs to) into a :class:`LoadedModel`; :func:`save_model` writes
new parameters in that model's format; :func:`save` writes a zoo model as a checkpoint.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.formats._checkpoint import CheckpointError, save
    from lmckit.formats._io import (
        check_same_architecture,
        load,
        load_model,
        save_model,
    )
    from lmckit.formats._loaded import LoadedModel

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
