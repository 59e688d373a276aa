"""Conversions of Hugging Face GPT-2 and ViT folders into lmckit zoo models (not the HF path).

The general path, :func:`lmckit.hf.load_hf`, loads any folder as the ``transformers``
module itself. These conversions instead rebuild a GPT2LMHeadModel or a
ViTForImageClassification as the zoo's ``gpt2`` / ``vit`` (whose hand-written features,
e.g. the circuit-form rewrites, experiments use). They read the folder's files alone
(:mod:`lmckit.hf._files`); ``transformers`` is not needed. Each converter is data plus a
small function: the zoo constructor arguments read from ``config.json``, and the
renaming of the checkpoint's weights into the zoo model's names.

Conversions (exact: the zoo model computes the same logits):

* GPT-2: HF's ``Conv1D`` stores ``(in, out)`` weights, the zoo's ``nn.Linear``
  ``(out, in)``: every 2-D block weight is transposed. A tied LM head (``tie_word_
  embeddings``, the default) is dropped in favour of ``transformer.wte.weight``.
  Checkpoints without the ``transformer.`` prefix (OpenAI's originals) and the causal
  mask buffers (``attn.bias``, ``attn.masked_bias``) of old checkpoints are accepted.
* ViT: the on-disk names are the zoo's names; the in-memory names of transformers >= 5
  (``vit.layers.{i}.attention.q_proj`` ...) are mapped back. Without QKV biases
  (``qkv_bias: false``) zero biases are added. The pooler of a bare ``ViTModel`` is
  dropped (the classifier reads the class token).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lmckit.hf._files import HFError, read_hf_config, read_hf_weights
from lmckit.models import ZooModel, create_model
from lmckit.symmetry._params import Params

__all__ = ["ZOO_CONVERSIONS", "hf_from_zoo", "zoo_from_hf", "zoo_from_state", "zoo_model_kwargs"]


# --------------------------------------------------------------------------- GPT-2


def _check(config: Mapping[str, Any], key: str, allowed: tuple[Any, ...], default: Any) -> None:
    value = config.get(key, default)
    if value not in allowed:
        raise HFError(
            f"unsupported Hugging Face config: {key}={value!r} (lmckit supports "
            f"{' or '.join(repr(a) for a in allowed)})"
        )


def _gpt2_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    # gelu_new and gelu_pytorch_tanh are both GELU's tanh approximation, the zoo's activation
    _check(config, "activation_function", ("gelu_new", "gelu_pytorch_tanh"), "gelu_new")
    _check(config, "scale_attn_weights", (True,), True)
    _check(config, "scale_attn_by_inverse_layer_idx", (False,), False)
    _check(config, "add_cross_attention", (False,), False)
    n_embd = int(config.get("n_embd", 768))
    n_inner = config.get("n_inner")
    return {
        "vocab_size": int(config.get("vocab_size", 50257)),
        "n_layer": int(config.get("n_layer", 12)),
        "n_head": int(config.get("n_head", 12)),
        "n_embd": n_embd,
        "n_inner": 4 * n_embd if n_inner is None else int(n_inner),
        "context": int(config.get("n_positions", 1024)),
        "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
        "dropout": float(config.get("resid_pdrop", 0.1)),
        "layer_norm_epsilon": float(config.get("layer_norm_epsilon", 1e-5)),
    }


def _gpt2_name(name: str, value: Tensor) -> str | None:
    """The zoo's name of a GPT-2 weight (``None``: not a weight the zoo holds)."""
    if name.endswith((".attn.masked_bias", ".attn.bias")) and value.ndim == 4:
        return None  # causal-mask buffers of old checkpoints, not weights
    if not name.startswith(("transformer.", "lm_head.")):
        return f"transformer.{name}"  # OpenAI's original checkpoints lack the prefix
    return name


def _gpt2_transposed(zoo_name: str, value: Tensor) -> bool:
    """Whether the zoo holds this weight transposed: Conv1D (in, out) -> Linear (out, in)."""
    return zoo_name.startswith("transformer.h.") and value.ndim == 2


def _gpt2_params(state: Mapping[str, Tensor], kwargs: Mapping[str, Any]) -> Params:
    out: Params = {}
    for name, value in state.items():
        zoo = _gpt2_name(name, value)
        if zoo is not None:
            out[zoo] = value.T if _gpt2_transposed(zoo, value) else value
    if kwargs["tie_embeddings"]:
        head = out.pop("lm_head.weight", None)
        wte = out.get("transformer.wte.weight")
        if head is not None and wte is not None and not torch.equal(head, wte):
            raise HFError("tie_word_embeddings is set but lm_head.weight differs from wte")
    return out


# --------------------------------------------------------------------------- ViT


def _single(value: Any, key: str) -> int:
    # HF allows image_size / patch_size as a pair; the zoo ViT is square
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise HFError(f"unsupported Hugging Face config: non-square {key}={value}")
        value = value[0]
    return int(value)


def _vit_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    _check(config, "hidden_act", ("gelu",), "gelu")
    labels = config.get("id2label")
    num_classes = len(labels) if isinstance(labels, Mapping) else config.get("num_labels", 2)
    return {
        "image_size": _single(config.get("image_size", 224), "image_size"),
        "patch_size": _single(config.get("patch_size", 16), "patch_size"),
        "in_channels": int(config.get("num_channels", 3)),
        "num_classes": int(num_classes),
        "width": int(config.get("hidden_size", 768)),
        "depth": int(config.get("num_hidden_layers", 12)),
        "heads": int(config.get("num_attention_heads", 12)),
        "mlp_dim": int(config.get("intermediate_size", 3072)),
        "class_token": True,
        "layer_norm_eps": float(config.get("layer_norm_eps", 1e-12)),
    }


# transformers >= 5 in-memory names -> on-disk (zoo) names
_VIT_RENAMES = (
    (r"^vit\.layers\.(\d+)\.", r"vit.encoder.layer.\1."),
    (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."),
    (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.fc1\.", ".intermediate.dense."),
    (r"\.mlp\.fc2\.", ".output.dense."),
)


def _vit_name(name: str, value: Tensor) -> str | None:
    """The zoo's (on-disk) name of a ViT weight (``None``: not one the zoo holds)."""
    if name.startswith("vit.pooler."):
        return None  # ViTModel's pooler: unused by the classifier
    for pattern, repl in _VIT_RENAMES:
        name = re.sub(pattern, repl, name)
    return name


def _vit_params(state: Mapping[str, Tensor], kwargs: Mapping[str, Any]) -> Params:
    out: Params = {}
    for name, value in state.items():
        zoo = _vit_name(name, value)
        if zoo is not None:
            out[zoo] = value
    width = kwargs["width"]
    for i in range(kwargs["depth"]):
        for part in ("query", "key", "value"):
            bias = f"vit.encoder.layer.{i}.attention.attention.{part}.bias"
            ref = out.get(f"vit.encoder.layer.{i}.attention.attention.{part}.weight")
            if bias not in out and ref is not None:
                out[bias] = torch.zeros(width, dtype=ref.dtype)  # qkv_bias: false
    return out


def _never(_name: str, _value: Tensor) -> bool:
    return False


# --------------------------------------------------------------------------- dispatch


@dataclass(frozen=True)
class _Converter:
    """How a ``model_type`` becomes a zoo model: its constructor arguments, its weights
    (``params``, the whole state), and per weight the zoo's name (``name``: ``None``
    for one the zoo does not hold) and whether the zoo holds it transposed (the two
    parts :func:`hf_from_zoo` inverts)."""

    zoo_name: str
    hf_class: str
    kwargs: Callable[[Mapping[str, Any]], dict[str, Any]]
    params: Callable[[Mapping[str, Tensor], Mapping[str, Any]], Params]
    name: Callable[[str, Tensor], str | None]
    transposed: Callable[[str, Tensor], bool]


#: ``model_type`` of ``config.json`` -> how to convert it into a zoo model.
ZOO_CONVERSIONS: dict[str, _Converter] = {
    "gpt2": _Converter(
        "gpt2", "GPT2LMHeadModel", _gpt2_kwargs, _gpt2_params, _gpt2_name, _gpt2_transposed
    ),
    "vit": _Converter(
        "vit", "ViTForImageClassification", _vit_kwargs, _vit_params, _vit_name, _never
    ),
}


def _converter(config: Mapping[str, Any], path: str | os.PathLike[str]) -> _Converter:
    model_type = config.get("model_type")
    if model_type not in ZOO_CONVERSIONS:
        raise HFError(
            f"{path}: unsupported model_type {model_type!r}; supported: "
            f"{', '.join(f'{k} ({c.hf_class})' for k, c in ZOO_CONVERSIONS.items())}"
        )
    return ZOO_CONVERSIONS[model_type]


def zoo_model_kwargs(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Zoo model name and constructor arguments for a Hugging Face ``config.json``."""
    conv = _converter(config, "config")
    return conv.zoo_name, conv.kwargs(config)


def zoo_from_hf(
    path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, **overrides: Any
) -> tuple[ZooModel, Params]:
    """Convert a local Hugging Face GPT-2 or ViT folder into a zoo model and its params.

    Args:
        path: folder with ``config.json`` and the weights (see :mod:`lmckit.hf._files`).
        dtype: floating dtype of the returned params (checkpoints may be half precision).
        overrides: zoo constructor arguments to change, e.g. ``dropout=0.0``.

    Returns:
        ``(module, params)``: the zoo module in eval mode holding ``params`` (so
        ``module(x)`` gives the HF model's logits on ``x``), and ``params``.

    Raises:
        HFError: on an unsupported architecture or option, or weights that do not
            match the configuration (names of missing and unexpected weights listed).
    """
    config = read_hf_config(path)
    _converter(config, path)  # an unsupported folder is refused before its weights are read
    return zoo_from_state(config, read_hf_weights(path), dtype=dtype, where=path, **overrides)


def zoo_from_state(
    config: Mapping[str, Any],
    state: Mapping[str, Tensor],
    *,
    dtype: torch.dtype = torch.float32,
    where: str | os.PathLike[str] = "the model",
    **overrides: Any,
) -> tuple[ZooModel, Params]:
    """:func:`zoo_from_hf` of a folder already read: its ``config.json`` and its weights
    (on-disk names, or the in-memory names of the ``transformers`` module holding them:
    a model loaded once is converted without reading the folder again)."""
    conv = _converter(config, where)
    kwargs = {**conv.kwargs(config), **overrides}
    params = conv.params(state, kwargs)
    # create_model builds a module of the right shapes; its weights are replaced below
    module, template = create_model(conv.zoo_name, seed=0, **kwargs)
    missing = sorted(template.keys() - params.keys())
    unexpected = sorted(params.keys() - template.keys())
    if missing or unexpected:
        raise HFError(
            f"{where}: weights do not match a {conv.zoo_name} of this config: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    out: Params = {}
    for name, ref in template.items():
        value = params[name]
        if value.shape != ref.shape:
            raise HFError(
                f"{where}: weight {name} has shape {tuple(value.shape)}, "
                f"expected {tuple(ref.shape)} for this config"
            )
        value = value.to(dtype) if value.is_floating_point() else value.to(ref.dtype)
        out[name] = value.contiguous().clone()
    # A module of this dtype holding exactly ``out`` (its random initial weights are gone).
    module.to(dtype).load_state_dict(out, strict=True, assign=True)
    return module.eval(), out


def hf_from_zoo(
    config: Mapping[str, Any],
    like: Mapping[str, Tensor],
    zoo: Mapping[str, Tensor],
    class_keys: Collection[str],
) -> Params | str:
    """The weights of a zoo model converted from a folder (:func:`zoo_from_state`), back
    under the folder's names and layout: the conversion inverted.

    Args:
        config: the folder's ``config.json``.
        like: the folder's own weights under the names to write (in-memory names).
        zoo: the zoo model's weights (e.g. B aligned in the zoo's form).
        class_keys: every weight name the folder's class holds (a tied weight under each
            of its names): a zoo weight the folder does not store (an untied LM head) is
            kept when the class has it.

    Returns:
        ``like`` with every weight the zoo holds replaced by the zoo's, or why the zoo's
        weights cannot be written in the class (a weight it has no name for).
    """
    conv = _converter(config, "config")
    names = {}
    for key, value in like.items():
        zoo_key = conv.name(key, value)
        if zoo_key is not None:
            names[zoo_key] = key
    out: Params = dict(like)
    for zoo_key, value in zoo.items():
        key = names.get(zoo_key, zoo_key)
        if key not in out and key not in class_keys:
            if value.is_floating_point() and not bool(value.any()):
                continue  # a zero the conversion added (ViT without query/key/value biases)
            return f"the class has no weight {key!r} for the zoo's {zoo_key!r}"
        out[key] = value.T if conv.transposed(zoo_key, value) else value
    return out
