"""Hugging Face folders in and out.

* :func:`load_hf` / :func:`from_hf`: any local folder ``transformers`` can build from its
  ``config.json`` (GPT-2, BERT, ViT, Llama, Mistral tested) as the ``transformers`` module
  itself, eval mode, with the folder's weights; nothing is downloaded.
* :func:`example_inputs`: small valid inputs for tracing, from the config.
* :func:`save_hf`: new parameters written back as a folder of the same class that
  ``AutoModel*.from_pretrained`` loads, with the source's tokenizer files and an
  ``lmckit.json`` saying what lmckit did.
* :func:`zoo_from_hf`: the conversion of GPT-2 and ViT folders into lmckit's own zoo
  models (for the zoo's hand-written features), not the general path.
"""

from lmckit.hf.files import HFError, is_hf_folder, read_hf_config, read_hf_weights
from lmckit.hf.model import HFModel, example_inputs, from_hf, load_hf
from lmckit.hf.save import save_hf
from lmckit.hf.zoo import ZOO_CONVERSIONS, zoo_from_hf, zoo_model_kwargs

__all__ = [
    "ZOO_CONVERSIONS",
    "HFError",
    "HFModel",
    "example_inputs",
    "from_hf",
    "is_hf_folder",
    "load_hf",
    "read_hf_config",
    "read_hf_weights",
    "save_hf",
    "zoo_from_hf",
    "zoo_model_kwargs",
]
