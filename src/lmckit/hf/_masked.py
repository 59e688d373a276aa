"""Keyword inputs that put every parameter of a Hugging Face model on its traced path.

A vision model with a learned mask token (DINOv2's, BEiT's) reads it only at the
patches ``bool_masked_pos`` marks. Traced on images alone, no op reads the token, so
no space holds it: a symmetry of the stream would leave it behind, and the aligned
model would compute B's function on plain images but not on masked ones. An all-false
mask changes no output and puts the token on the traced path
(``embeddings * (1 - mask) + mask_token * mask``), where it joins the stream.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.formats._loaded import LoadedModel
from lmckit.hf._model import as_pair, example_inputs

__all__ = ["example_call", "example_keywords"]

#: the keyword ``transformers`` vision models take the masked patches by
MASKED_POSITIONS = "bool_masked_pos"


def example_keywords(model: LoadedModel | nn.Module, *, batch: int = 2) -> dict[str, Tensor]:
    """Keyword inputs to trace ``model`` with besides :func:`~lmckit.hf.example_inputs`:
    ``bool_masked_pos`` all false ``(batch, patches)`` when a submodule holds a
    ``mask_token`` parameter and takes ``bool_masked_pos``, and the model's ``forward``
    takes it (by name, or among its ``**kwargs``); else nothing."""
    module = model.module if isinstance(model, LoadedModel) else model
    if not _takes(module, MASKED_POSITIONS, keywords=True):
        return {}
    holders = [
        m
        for m in module.modules()
        if isinstance(getattr(m, "mask_token", None), nn.Parameter)
        and _takes(m, MASKED_POSITIONS, keywords=False)
    ]
    config: Any = getattr(module, "config", None)
    vision = getattr(config, "vision_config", None) or config
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if not holders or size is None or patch is None:
        return {}
    (height, width), (rows, cols) = as_pair(size), as_pair(patch)
    patches = (height // rows) * (width // cols)
    return {MASKED_POSITIONS: torch.zeros(batch, patches, dtype=torch.bool)}


def _takes(module: nn.Module, name: str, *, keywords: bool) -> bool:
    """Whether ``module.forward`` has a parameter ``name`` (or, with ``keywords``, any
    keyword through ``**kwargs``)."""
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    if name in parameters:
        return True
    return keywords and any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def example_call(model: LoadedModel | nn.Module) -> tuple[Tensor | None, ...] | dict[str, Any]:
    """:func:`~lmckit.hf.example_inputs`, and with :func:`example_keywords` when there
    are any: then all of them by name, as a dict of keyword inputs."""
    module = model.module if isinstance(model, LoadedModel) else model
    positional = example_inputs(module)
    keywords = example_keywords(module, batch=_batch(positional))
    if not keywords:
        return positional
    bound = inspect.signature(module.forward).bind_partial(*positional)
    return {**bound.arguments, **keywords}


def _batch(inputs: tuple[Tensor | None, ...]) -> int:
    first = next((x for x in inputs if isinstance(x, Tensor)), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1
