"""The Python API's arguments checked where they come in, each refused in one line.

:func:`lmckit.align`, :class:`lmckit.Aligned`'s methods, :func:`lmckit.evaluate_path`
and :func:`lmckit.load` take arguments that PyTorch would otherwise reject deep inside,
with an error that names an internal variable or none at all (``manual_seed expected a
long``, ``Cannot copy out of meta tensor``, ``'dict' object has no attribute 'start'``).
Each check here raises a ``TypeError`` (the wrong kind of value) or a ``ValueError``
subclass (a value out of range) whose message names the Python parameter (``seed=``,
``device=``, ``config=``) and what it expects, before anything is loaded or computed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = [
    "align_arguments",
    "check_float_dtype",
    "check_module",
    "check_points",
    "method_config",
    "probe_example_inputs",
    "usable_device",
]


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


def usable_device(device: object, *, given: str | None = None) -> torch.device:
    """``device`` as a ``torch.device`` that can compute and hand results back: a tiny
    product runs there and is copied to the CPU (``meta`` holds shapes, not numbers; a
    backend this PyTorch was not built with fails the same way).

    Args:
        device: a name (``"cpu"``, ``"cuda:0"``) or a device.
        given: how messages name it (default ``device='NAME'``; the command line passes
            ``--device NAME``).

    Raises:
        TypeError: not a string or a ``torch.device``.
        ValueError: a name PyTorch does not know, CUDA where none is available, or a
            device that cannot compute.
    """
    given = given or f"device={str(device)!r}"
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a string such as 'cpu' or a torch.device, got {device!r}")
    try:
        found = torch.device(device)
    except RuntimeError as err:
        reason = (str(err).splitlines() or [""])[0].split(" at start of device string")[0]
        raise ValueError(f"bad {given}: {reason}") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{given}: no CUDA device is available")
    try:
        probe = torch.ones(2, 2, device=found)
        ok = bool(((probe @ probe).cpu() == 2).all())
    except (RuntimeError, NotImplementedError, AssertionError) as err:
        reason = (str(err).splitlines() or [type(err).__name__])[0].split(". ")[0]
        raise ValueError(f"{given}: cannot compute there ({reason})") from None
    if not ok:
        raise ValueError(f"{given}: a test computation gave a wrong result")
    return found


def check_module(module: nn.Module, what: str) -> None:
    """Refuse a module whose weights lmckit cannot compute with: parameters on the meta
    device (shapes without values) or parameters that are not floating point.

    Args:
        module: the module as the caller holds it.
        what: how messages name it, e.g. ``"a"`` (the parameter it was passed as).

    Raises:
        ValueError: naming the first such parameter and what to do.
    """
    for name, param in module.named_parameters():
        if param.is_meta:
            raise ValueError(
                f"{what}: its parameter {name!r} is on the meta device (a shape without "
                "values): load its weights first, e.g. module.to_empty(device='cpu') and "
                "load_state_dict"
            )
        if not param.is_floating_point():
            raise ValueError(
                f"{what}: its parameter {name!r} is {param.dtype}, not floating point; lmckit "
                "aligns floating-point weights (keep integer tensors as buffers)"
            )


def check_float_dtype(dtype: object, name: str = "dtype") -> torch.dtype | None:
    """``dtype`` if it is ``None`` or a floating-point ``torch.dtype``.

    Raises:
        TypeError: not a ``torch.dtype`` (a string such as ``"float16"`` is named, with
            the dtype it means).
        ValueError: an integer or boolean dtype.
    """
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype):
        hint = ""
        if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
            hint = f": pass torch.{dtype}"
        raise TypeError(f"{name} must be a torch.dtype or None, got {dtype!r}{hint}")
    if not dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point dtype or None, got {dtype}")
    return dtype


def check_points(points: object, name: str = "points") -> int:
    """``points`` if it is an integer (its range is the evaluation's to check).

    Raises:
        TypeError: not an integer (a string, a float, ``True``).
    """
    if isinstance(points, bool) or not isinstance(points, int):
        raise TypeError(f"{name} must be an integer, got {points!r}")
    return points


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
