""":func:`lmckit.align`'s own arguments checked before anything is loaded: the seed, the
method's config (a dict converted, each field checked against its type), the device,
and example inputs the module can run on; each refused in one line naming the parameter."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from lmckit._arguments import usable_device

__all__ = ["align_arguments", "method_config", "probe_example_inputs"]


def align_arguments(
    method: str, *, seed: object, config: object, device: object
) -> tuple[int, Any, torch.device | None]:
    """:func:`lmckit.align`'s ``seed``, ``config`` and ``device`` checked (and the config
    converted from a dict), before anything is loaded.

    Raises:
        TypeError, ValueError: naming the parameter (:func:`lmckit.runtime._seeds.check_seed`,
            :func:`method_config`, :func:`usable_device`).
    """
    from lmckit.runtime._seeds import check_seed

    checked = check_seed(seed)
    found = usable_device(device) if device is not None else None
    return checked, method_config(method, config), found


def probe_example_inputs(module: nn.Module, example_inputs: object) -> None:
    """Refuse example inputs ``module`` cannot run on (wrong shape or dtype, token ids
    beyond its vocabulary) in one line, before any tracing.

    Raises:
        TypeError: inputs of a kind or number ``forward`` does not take.
        DataMismatchError: the module fails on them (naming the inputs and the reason).
    """
    from lmckit.inference._inputs import bind_inputs, split_inputs
    from lmckit.measure._batchfit import describe, probe_inputs

    args, kwargs = split_inputs(example_inputs, module=module)
    bind_inputs(module, args, kwargs)
    shown = describe(*split_inputs(example_inputs))  # as given (without use_cache=False)
    probe_inputs(module, args, kwargs, what="example_inputs", shown=shown)


def method_config(method: str, config: object) -> Any:
    """The config of aligner ``method`` (``"weight"``, ``"activation"``, ``"learned"``)
    from ``config``: ``None`` (its defaults), an instance of its config class, or a dict
    of that class's fields, each checked against the field's type.

    Raises:
        TypeError: another kind of config (another method's, a string), a key the class
            has no field for, or a value of the wrong type, naming the class and field.
        ValueError: a value the class itself refuses (its own message).
    """
    from lmckit.aligners._registry import aligner_info
    from lmckit.plan._request import ALIGN_METHODS

    if config is None or method not in ALIGN_METHODS:
        return config  # an unknown method is named by the request's own check
    cls = aligner_info(ALIGN_METHODS[method]).config
    if cls is None or isinstance(config, cls):
        return config
    if not isinstance(config, Mapping):
        raise TypeError(
            f"config must be a {cls.__name__} (or a dict of its fields) for method="
            f"{method!r}, got {type(config).__name__}"
        )
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    for key, value in config.items():
        if key not in fields:
            raise TypeError(
                f"config: {cls.__name__} has no field {key!r}; its fields are {', '.join(fields)}"
            )
        if not _fits(value, hints.get(key, Any)):
            raise TypeError(
                f"config: {cls.__name__}.{key} must be {_type_name(hints[key])}, got {value!r}"
            )
    return cls(**config)


def _fits(value: object, hint: Any) -> bool:
    """Whether ``value`` is of the (simple) type ``hint``; types beyond numbers, strings,
    literals and optionals are left to the config class."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin is not None:
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "None"
    return {int: "an integer", float: "a number", str: "a string", bool: "True or False"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )
