"""Does a dataset fit a model? Checked up front, with both numbers in every message.

Feeding a model data of the wrong shape fails deep inside PyTorch (a matmul, an
embedding lookup) or, worse, does not fail at all: ten logits scored against five
classes evaluate without a word. :func:`check_data_fits` compares the data with the
model before any work: the kind of input (token ids or features), the input shape,
the number of classes both ways and, for language models, the vocabulary and the
context length. Zoo models are checked from their config; any other module by one
forward pass of a single example.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lmckit.data import Dataset
from lmckit.models import ZooModel
from lmckit.training._task import predictions

__all__ = ["DataMismatchError", "check_data_fits"]


class DataMismatchError(ValueError):
    """The data does not fit the model; the message names both sides."""


def _kwargs(model: nn.Module) -> tuple[str, dict]:
    config = getattr(model, "config", None)
    name = getattr(config, "name", type(model).__name__)
    kwargs = getattr(config, "kwargs", None)
    return str(name), dict(kwargs) if isinstance(kwargs, dict) else {}


def _is_transformers_model(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.")


def _check_token_model(model: nn.Module, data: Dataset) -> None:
    """Vocabulary and context of a module that embeds token ids (e.g. Hugging Face); a
    ``transformers`` model must be a causal language model (the targets are next tokens)."""
    if _is_transformers_model(model):
        from lmckit.hf._model import is_causal_lm

        if not is_causal_lm(model):
            raise DataMismatchError(
                f"{type(model).__name__} is not a causal language model: {data.name} data is "
                "scored by next-token loss, which means nothing for it (a masked LM predicts "
                "masked tokens); use text data with a causal LM only"
            )
    embeddings = getattr(model, "get_input_embeddings", None)
    table = embeddings() if callable(embeddings) else None
    name, d = type(model).__name__, data.name
    if isinstance(table, nn.Embedding) and data.num_classes > table.num_embeddings:
        raise DataMismatchError(
            f"{d}'s tokenizer has {data.num_classes} tokens but {name}'s vocabulary has "
            f"{table.num_embeddings}; use the tokenizer the model was trained with"
        )
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and data.input_shape[0] > context:
        raise DataMismatchError(
            f"{d} has blocks of {data.input_shape[0]} tokens but {name} takes at most "
            f"{context}; use block={context} or less"
        )


def _check_zoo(name: str, kw: dict, data: Dataset) -> None:
    """Config-level checks of the zoo's architectures (precise messages)."""
    shape, d = data.input_shape, data.name
    if name == "gpt2":
        if not data.is_language:
            raise DataMismatchError(f"{name} reads token ids; {d} has feature inputs {shape}")
        vocab, context = kw.get("vocab_size"), kw.get("context", 256)
        if isinstance(vocab, int) and vocab != data.num_classes:
            raise DataMismatchError(
                f"the model's vocabulary has {vocab} tokens but {d}'s tokenizer has "
                f"{data.num_classes}; use the tokenizer the model was trained with"
            )
        if isinstance(context, int) and shape[0] > context:
            raise DataMismatchError(
                f"{d} has blocks of {shape[0]} tokens but the model's context is {context}; "
                f"use block={context} or less"
            )
        return
    if data.is_language:
        raise DataMismatchError(f"{name} reads features or images; {d} holds token ids")
    if name == "mlp" and isinstance(kw.get("in_features"), int):
        features = math.prod(shape)
        if features != kw["in_features"]:
            raise DataMismatchError(
                f"the model takes {kw['in_features']} input features but {d}'s inputs "
                f"{shape} have {features}"
            )
    channels = kw.get("in_channels")
    if isinstance(channels, int):
        if len(shape) != 3:
            raise DataMismatchError(
                f"{name} takes images (channels, height, width); {d} has inputs of shape {shape}"
            )
        if shape[0] != channels:
            raise DataMismatchError(
                f"the model takes images with {channels} channels but {d}'s have {shape[0]}"
            )
        size = kw.get("image_size")
        if isinstance(size, int) and tuple(shape[1:]) != (size, size):
            raise DataMismatchError(
                f"the model takes {size}x{size} images but {d}'s are {shape[1]}x{shape[2]}"
            )


def check_data_fits(model: nn.Module, data: Dataset) -> None:
    """Raise :class:`DataMismatchError` unless ``data`` fits ``model``.

    Checks, each message naming the model's number and the data's: token ids versus
    features; the input shape (MLP features, image channels and size, GPT-2 context);
    the number of outputs against the number of classes (both ways: a model with more
    outputs than the data has classes is refused too); the vocabulary of a language
    model against the tokenizer's; token data (scored by next-token loss) only for a
    causal language model of ``transformers``. Unknown modules are probed with one
    example.
    """
    name, kw = _kwargs(model)
    if isinstance(model, ZooModel):
        _check_zoo(name, kw, data)
    elif data.is_language:
        _check_token_model(model, data)
    x = data.x_test[:1] if data.x_test.shape[0] else data.x_train[:1]
    first = next(iter(model.parameters()), None)
    if first is not None:
        x = x.to(first.device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
    except (RuntimeError, ValueError, IndexError, TypeError) as err:
        kind = "token ids" if data.is_language else "inputs"
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataMismatchError(
            f"{data.name}'s {kind} of shape {data.input_shape} do not fit {name}: {reason}"
        ) from None
    finally:
        model.train(was_training)
    try:
        out = predictions(out)  # a Hugging Face output's logits
    except TypeError:
        return  # no prediction tensor: nothing more to compare
    if out.ndim < 2:
        return  # not a classifier's logits: nothing more to compare
    outputs = out.shape[-1]
    if data.is_language and outputs > data.num_classes:
        return  # a vocabulary padded beyond the tokenizer's: every token id has a logit
    if outputs != data.num_classes:
        what = "tokens in its vocabulary" if data.is_language else "outputs (classes)"
        theirs = "tokens in its tokenizer's vocabulary" if data.is_language else "classes"
        raise DataMismatchError(
            f"the model has {outputs} {what} but {data.name} has {data.num_classes} {theirs}"
        )
