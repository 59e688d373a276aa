"""Hugging Face folders in and out.

* :func:`load_hf`: the format's reader (:func:`lmckit.load` reads every format): any
  local folder ``transformers`` can build from its ``config.json`` (GPT-2, BERT, ViT,
  Llama, Mistral tested) as the ``transformers`` module itself, eval mode, with the
  folder's weights, a :class:`~lmckit.formats.LoadedModel` of :class:`HFFormat`; nothing
  is downloaded.
* :func:`example_inputs`: small valid inputs for tracing, from the config.
* :func:`save_hf`: new parameters written back as a folder of the same class that
  ``AutoModel*.from_pretrained`` loads, with the source's tokenizer files and an
  ``lmckit.json`` saying what lmckit did.
* :func:`zoo_from_hf` / :func:`zoo_from_state`: the conversion of GPT-2 and ViT folders
  into lmckit's own zoo models (for the zoo's hand-written features), not the general
  path; :func:`hf_from_zoo` inverts it.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.hf._files import HFError
    from lmckit.hf._model import example_inputs, load_hf
    from lmckit.hf._save import save_hf
    from lmckit.hf._zoo import hf_from_zoo, zoo_from_hf

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
