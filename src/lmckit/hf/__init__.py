"""Hugging Face folders in and out.

* :func:`load_hf`: the format's reader (:func:`lmckit.load` reads every format): any
  local folder ``transformers`` can build from its ``config.json`` (GPT-2, BERT, ViT,
  Llama, Mistral tested) as the ``transformers`` module itself, eval mode, with the
  folder's weights, a :class:`~lmckit.loaded.LoadedModel` of :class:`HFFormat`; nothing
  is downloaded.
* :func:`example_inputs`: small valid inputs for tracing, from the config.
* :func:`save_hf`: new parameters written back as a folder of the same class that
  ``AutoModel*.from_pretrained`` loads, with the source's tokenizer files and an
  ``lmckit.json`` saying what lmckit did.
* :func:`zoo_from_hf` / :func:`zoo_from_state`: the conversion of GPT-2 and ViT folders
  into lmckit's own zoo models (for the zoo's hand-written features), not the general
  path; :func:`hf_from_zoo` inverts it.
"""

from lmckit.hf.files import HFError, is_hf_folder, read_hf_config, read_hf_weights
from lmckit.hf.model import HFFormat, example_inputs, held_hf, load_hf
from lmckit.hf.save import save_hf
from lmckit.hf.zoo import (
    ZOO_CONVERSIONS,
    hf_from_zoo,
    zoo_from_hf,
    zoo_from_state,
    zoo_model_kwargs,
)

__all__ = [
    "ZOO_CONVERSIONS",
    "HFError",
    "HFFormat",
    "example_inputs",
    "held_hf",
    "hf_from_zoo",
    "is_hf_folder",
    "load_hf",
    "read_hf_config",
    "read_hf_weights",
    "save_hf",
    "zoo_from_hf",
    "zoo_from_state",
    "zoo_model_kwargs",
]
