"""An oracle that is not the spec: symmetries planted from each family's architecture.

:data:`LAYOUTS` maps a family of ``tests/tiny_models.py`` to its hand-written layout
(read from the family's ``modeling_*.py`` in ``transformers``), :func:`plant` draws and
applies a random element of the symmetries it names. Nothing here imports lmckit.
"""

from . import decoders as decoders
from . import encoders as encoders
from . import gpt_decoders as gpt_decoders
from . import mixtures as mixtures
from . import seq2seq as seq2seq
from . import vision as vision
from .engine import Layout, fold, plant
from .layouts import LAYOUTS

__all__ = ["LAYOUTS", "Layout", "fold", "plant"]
