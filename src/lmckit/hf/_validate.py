"""A Hugging Face config checked against its weights before anything is allocated.

lmckit's own checkpoints are checked this way too (:func:`lmckit.formats.load`): a
``config.json`` that claims a million layers or a vocabulary of a billion tokens beside
a few kilobytes of weights is refused from the config and the safetensors header, in
well under a second, instead of hanging or allocating what the config claims:

1. every layer holds at least one tensor, so a layer count above the number of tensors
   stored is wrong (checked before even a shapes-only module is built: building a
   million layers on the meta device takes minutes);
2. the module is built on the meta device (shapes only, no memory) and compared with
   the stored weights: a weight stored under the module's own name must have its shape
   and a floating dtype; the module may not have more parameters than the file holds
   values (``transformers`` renames and fuses some weights on loading, which keeps the
   count); weights missing by name are named when the file's names are the module's;
3. the module's parameters in the dtype they will be computed in, and its buffers
   (position tables and masks the config sizes, which no weights file stores), must
   fit in the memory available, and the message says both numbers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from lmckit.formats._weightfile import SAFETENSORS_FLOATS
from lmckit.hf._build import import_transformers, quiet
from lmckit.hf._files import HFError
from lmckit.models._sizing import memory_bytes
from lmckit.symmetry._params import Params

__all__ = ["Layout", "check_config_fits", "layout_of", "meta_module"]

#: ``{name: (safetensors dtype name, shape)}`` of stored weights.
Layout = Mapping[str, tuple[str, tuple[int, ...]]]

# Config keys that count layers: n_layer, num_hidden_layers, num_layers, encoder_layers, ...
_LAYER_KEY = re.compile(r"(^|_)layers?$")
_DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


def layout_of(params: Params) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The :data:`Layout` of weights already read (a pickle has no header)."""
    return {k: (_DTYPE_NAMES.get(v.dtype, str(v.dtype)), tuple(v.shape)) for k, v in params.items()}


def _layer_counts(raw: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, int]]:
    for key, value in raw.items():
        if isinstance(value, Mapping):  # a sub-config (text_config, vision_config)
            yield from _layer_counts(value, f"{prefix}{key}.")
        elif (
            isinstance(value, int)
            and not isinstance(value, bool)
            and _LAYER_KEY.search(key)
            and not key.startswith("max_")  # a bound (Qwen2.5-3B: max_window_layers 70 of 36)
        ):
            yield f"{prefix}{key}", value


def _check_layer_counts(raw: Mapping[str, Any], tensors: int, where: os.PathLike[str]) -> None:
    for key, count in _layer_counts(raw):
        if count > tensors:
            raise HFError(
                f"{where}: {key} is {count}, but the weights hold only {tensors} tensors "
                "(every layer holds at least one)"
            )


def meta_module(cls: type, config: Any, where: str | os.PathLike[str]) -> nn.Module:
    """``cls(config)`` on the meta device: shapes and dtypes, no memory, no init cost."""
    transformers = import_transformers()
    try:
        with quiet(transformers), torch.random.fork_rng(devices=[]), torch.device("meta"):
            module: nn.Module = cls(config)
    except Exception as err:  # whatever the model's __init__ raises on this config
        reason = " ".join(str(err).split()) or type(err).__name__
        raise HFError(f"{where}: transformers cannot build {cls.__name__}: {reason}") from None
    return module


def _names(keys: list[str]) -> str:
    shown = sorted(keys)
    return ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")


def _check_names_and_shapes(module: nn.Module, layout: Layout, name: str, where: Any) -> None:
    state = module.state_dict()
    for key, (dtype, shape) in sorted(layout.items()):
        if key not in state:
            continue
        expected = tuple(state[key].shape)
        if tuple(shape) != expected:
            raise HFError(
                f"{where}: weight {key} has shape {tuple(shape)}, but a {name} of this config "
                f"expects {expected}"
            )
        if state[key].is_floating_point() and dtype not in SAFETENSORS_FLOATS:
            raise HFError(
                f"{where}: weight {key} is stored as {dtype}, not floating point; lmckit "
                "needs floating-point weights (float32, float16, bfloat16 or float64)"
            )
    tied = set(getattr(module, "all_tied_weights_keys", {}) or {})
    params = {k for k, _ in module.named_parameters(remove_duplicate=False)}
    missing = sorted(params - layout.keys() - tied)
    if missing and layout.keys() <= state.keys():
        # the file uses the module's own names and lacks some of them
        raise HFError(f"{where}: weights do not fit a {name} of this config: missing "
                      f"{_names(missing)}")  # fmt: skip


def check_config_fits(
    cls: type,
    config: Any,
    raw: Mapping[str, Any],
    layout: Layout,
    *,
    dtype: torch.dtype | None,
    where: os.PathLike[str],
    limit_bytes: int | None = None,
) -> None:
    """Refuse a config that does not fit its stored weights, or the memory, before allocating.

    Args:
        cls: the ``transformers`` class the folder becomes.
        config: its config object; ``raw``: the ``config.json`` it came from.
        layout: the stored weights' names, dtypes and shapes (:func:`layout_of`, or
            :func:`lmckit.hf._files.read_hf_header`).
        dtype: the dtype the module will compute in (``None``: as stored).
        where: the folder, named in errors.
        limit_bytes: the memory budget; ``None``: what this machine has available.

    Raises:
        HFError: naming the config entry or weight, and both sizes.
    """
    _check_layer_counts(raw, len(layout), where)
    module = meta_module(cls, config, where)
    name = cls.__name__
    _check_names_and_shapes(module, layout, name, where)
    needed = sum(p.numel() for p in module.parameters())  # tied weights once
    stored = sum(_numel(shape) for _, shape in layout.values())
    if needed > stored:
        raise HFError(
            f"{where}: config.json describes a {name} of {needed:,} parameters, but the "
            f"weights hold {stored:,} values; a size in the config does not match the weights"
        )
    if dtype is not None:
        itemsize = torch.empty((), dtype=dtype).element_size()
    else:
        itemsize = max((_ITEMSIZE.get(d, 4) for d, _ in layout.values()), default=4)
    buffers = _buffer_bytes(module, dtype)
    total = needed * itemsize + buffers
    budget = memory_bytes() if limit_bytes is None else limit_bytes
    if budget is not None and total > budget:
        held = f", and {_bytes(buffers)} of buffers the config sizes" if buffers else ""
        raise HFError(
            f"{where}: a {name} of this config needs {_bytes(total)} ({needed:,} "
            f"parameters{held}), more than the {_bytes(budget)} of memory available"
        )


def _buffer_bytes(module: nn.Module, dtype: torch.dtype | None) -> int:
    """Bytes of the module's buffers (position tables, masks: sized by the config, not
    stored in the weights), floating ones in ``dtype`` when it is given."""
    total = 0
    for buffer in module.buffers():
        size = buffer.element_size()
        if dtype is not None and buffer.is_floating_point():
            size = torch.empty((), dtype=dtype).element_size()
        total += buffer.numel() * size
    return total


def _bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
