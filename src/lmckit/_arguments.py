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

import torch
from torch import nn

__all__ = ["check_float_dtype", "check_module", "check_points", "usable_device"]


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
