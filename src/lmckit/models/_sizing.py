"""A zoo model sized for a dataset, and its memory counted before anything is allocated.

:func:`sized_config` turns a few user-facing sizes (:class:`ModelOptions`: MLP width
and depth, a CNN's width multiplier, a transformer's layers, heads and widths) and the
shape of the data (input shape, number of classes or vocabulary, tokens or features)
into the constructor arguments of one zoo architecture. A config's parameters are counted
on the meta device (no memory, no initialisation), so callers can refuse a model that
would not fit before building it (:func:`check_fits_in_memory`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from lmckit._errors import ParameterError
from lmckit.models._registry import ModelConfig, ZooModel, build_zoo_model

__all__ = [
    "ARCHITECTURES",
    "MAX_LAYERS",
    "ModelOptions",
    "check_fits_in_memory",
    "memory_bytes",
    "meta_model",
    "sized_config",
]

#: Architectures :func:`sized_config` can size for a dataset.
ARCHITECTURES = ("mlp", "vgg", "resnet20", "gpt2", "vit")
_TRANSFORMERS = ("gpt2", "vit")
#: Most layers a sized model may have (building even a shapes-only module loops per layer).
MAX_LAYERS = 1024
_NORMS = ("auto", "none", "batch", "layer", "group", "rms")


@dataclass(frozen=True)
class ModelOptions:
    """User-facing sizes of a zoo model; each architecture reads the ones it has.

    Attributes:
        width, depth: MLP hidden width and number of hidden layers (>= 1).
        width_mult: channel multiplier of VGG (> 0) and ResNet20 (a positive integer).
        norm: ``auto`` (none for MLPs, batch for CNNs, layer for transformers), ``none``,
            ``batch``, ``layer``, ``group`` or ``rms`` (transformers: ``layer`` or ``rms``).
        activation: MLP activation, ``relu`` or ``gelu``.
        n_layer, n_head, n_embd: transformer layers, heads per layer, residual width.
        n_inner: transformer MLP width; ``None``: ``4 * n_embd``.
        context: GPT-2 maximum sequence length; ``None``: the data's block length.
        patch_size: ViT patch size.
        dropout: GPT-2 dropout probability, in ``[0, 1)`` (other architectures have
            none: :func:`sized_config` refuses a non-zero value for them).
        tie_embeddings: GPT-2's LM head is ``wte^T``.
    """

    width: int = 512
    depth: int = 3
    width_mult: float = 1.0
    norm: str = "auto"
    activation: str = "relu"
    n_layer: int = 6
    n_head: int = 4
    n_embd: int = 256
    n_inner: int | None = None
    context: int | None = None
    patch_size: int = 4
    dropout: float = 0.0
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("width", "depth", "n_layer", "n_head", "n_embd", "patch_size"):
            _positive(name, getattr(self, name))
        for name in ("depth", "n_layer"):
            if getattr(self, name) > MAX_LAYERS:
                raise ValueError(f"{name} must be at most {MAX_LAYERS}, got {getattr(self, name)}")
        for name in ("n_inner", "context"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if not (math.isfinite(self.width_mult) and self.width_mult > 0):
            raise ValueError(f"width_mult must be a positive number, got {self.width_mult}")
        if self.norm not in _NORMS:
            raise ValueError(f"norm must be one of {', '.join(_NORMS)}, got {self.norm!r}")
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be relu or gelu, got {self.activation!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def sized_config(
    name: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    tokens: bool,
    options: ModelOptions | None = None,
    data_name: str = "the data",
) -> ModelConfig:
    """The config of zoo model ``name`` sized for data of this shape.

    Args:
        name: one of :data:`ARCHITECTURES`.
        input_shape: one input, e.g. ``(1, 28, 28)``, ``(32,)`` or ``(block,)`` for tokens.
        num_classes: classes, or the vocabulary size for token data.
        tokens: whether inputs are token ids (language modelling).
        options: the sizes; defaults as in :class:`ModelOptions`.
        data_name: how messages name the data.

    Raises:
        ValueError: the architecture does not fit the data (naming both), or a size is
            invalid.
    """
    opts = options or ModelOptions()
    if name not in ARCHITECTURES:
        raise ValueError(f"cannot size {name!r} for data; choose one of {', '.join(ARCHITECTURES)}")
    if opts.dropout and name != "gpt2":
        # an option the architecture has no place for is refused, not silently dropped
        raise ValueError(f"dropout is for gpt2 only; {name} has no dropout (got {opts.dropout})")
    if name in _TRANSFORMERS:
        return ModelConfig(name, _transformer_kwargs(name, input_shape, num_classes, tokens, opts,
                                                     data_name))  # fmt: skip
    if tokens:
        raise ValueError(f"{name} needs feature or image data; {data_name} holds token ids")
    if name == "mlp":
        return ModelConfig(
            name,
            {
                "in_features": math.prod(input_shape),
                "hidden": [opts.width] * opts.depth,
                "out_features": num_classes,
                "activation": opts.activation,
                "norm": "none" if opts.norm == "auto" else opts.norm,
            },
        )
    if len(input_shape) != 3:
        raise ValueError(
            f"{name} needs image data (channels, height, width); "
            f"{data_name} has inputs of shape {input_shape}"
        )
    norm = "batch" if opts.norm == "auto" else opts.norm
    if name == "vgg":
        kwargs: dict[str, Any] = {
            "in_channels": input_shape[0],
            "num_classes": num_classes,
            "image_size": input_shape[1],
            "width_mult": opts.width_mult,
            "norm": norm,
        }
        return ModelConfig(name, kwargs)
    if opts.width_mult != int(opts.width_mult):
        raise ValueError(f"resnet20 takes an integer width multiplier, got {opts.width_mult}")
    kwargs = {
        "in_channels": input_shape[0],
        "num_classes": num_classes,
        "width_mult": int(opts.width_mult),
        "norm": norm,
    }
    return ModelConfig(name, kwargs)


def _transformer_kwargs(
    name: str,
    shape: tuple[int, ...],
    num_classes: int,
    tokens: bool,
    opts: ModelOptions,
    data_name: str,
) -> dict[str, Any]:
    """GPT-2 (token data) or ViT (square images) arguments; the norm is layer or rms."""
    if opts.norm not in ("auto", "layer", "rms"):
        raise ParameterError(f"{name} takes {{norm}} layer or rms (auto = layer), got {opts.norm}",
                             norm="norm")  # fmt: skip
    norm = "layer" if opts.norm == "auto" else opts.norm
    if name == "gpt2":
        if not tokens:
            raise ValueError(f"gpt2 needs token data (e.g. shakespeare:...); {data_name} is not")
        block = shape[0]
        context = block if opts.context is None else opts.context
        if context < block:
            raise ParameterError(
                f"{{context}} {context} is shorter than the data's blocks of {block}",
                context="context",
            )
        return {
            "vocab_size": num_classes,
            "n_layer": opts.n_layer,
            "n_head": opts.n_head,
            "n_embd": opts.n_embd,
            "n_inner": opts.n_inner,
            "context": context,
            "norm": norm,
            "tie_embeddings": opts.tie_embeddings,
            "dropout": opts.dropout,
        }
    if len(shape) != 3 or shape[1] != shape[2] or tokens:
        raise ValueError(f"vit needs square images (channels, size, size); {data_name} has {shape}")
    return {
        "image_size": shape[1],
        "patch_size": opts.patch_size,
        "in_channels": shape[0],
        "num_classes": num_classes,
        "width": opts.n_embd,
        "depth": opts.n_layer,
        "heads": opts.n_head,
        "mlp_dim": opts.n_inner,
        "norm": norm,
    }


def meta_model(config: ModelConfig) -> ZooModel:
    """The module of ``config`` on the meta device: shapes only, so a config with billions
    of parameters costs nothing to build.

    Raises:
        ValueError: the config cannot be built (a bad or absurd size).
    """
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            return build_zoo_model(config)
    except (ValueError, TypeError, RuntimeError, OverflowError) as err:
        raise ValueError(f"cannot build {config.name}: {err}") from None


def _parameter_bytes(config: ModelConfig, *, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the state dict of ``config`` in ``dtype``, counted without allocating."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(t.numel() for t in meta_model(config).state_dict().values()) * itemsize


def memory_bytes() -> int | None:
    """Memory available to a new allocation, in bytes (``None`` where unknown).

    ``MemAvailable`` from ``/proc/meminfo`` where there is one, else physical memory.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_in_memory(
    config: ModelConfig, *, copies: int = 1, limit_bytes: int | None = None
) -> int:
    """Refuse a model whose ``copies`` float32 state dicts exceed memory; return its bytes.

    Args:
        config: the architecture.
        copies: state-dict-sized buffers the caller will hold (training with Adam holds
            about four: weights, gradients, two moments).
        limit_bytes: the budget; ``None``: this machine's physical memory.

    Raises:
        ValueError: naming the parameter count, the bytes needed and the budget.
    """
    need = _parameter_bytes(config)
    budget = memory_bytes() if limit_bytes is None else limit_bytes
    if budget is not None and need * copies > budget:
        count = need // 4
        raise ValueError(
            f"{config.name} would have {count:,} parameters ({need * copies / 2**30:.1f} GiB "
            f"for {copies} float32 cop{'y' if copies == 1 else 'ies'}), more than the "
            f"{budget / 2**30:.1f} GiB available; choose smaller sizes"
        )
    return need
