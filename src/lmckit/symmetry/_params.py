"""`Params`: a flat state dict, and pure functions on it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, MutableMapping

import torch
from torch import Tensor

Params = dict[str, Tensor]

__all__ = [
    "Float32View",
    "IncompatibleModelsError",
    "LazyParams",
    "Params",
    "as_module",
    "as_params",
    "check_compatible",
    "check_finite",
    "device_of",
    "dtype_of",
    "first_nonfinite",
    "layout",
    "meta_of",
    "module_params",
    "rounded_finite",
    "rows_of",
    "stored_dtype",
    "stored_params",
]


class LazyParams(Mapping[str, Tensor], ABC):
    """A state dict whose tensors are computed when read (a model with its norm scales
    folded, a point on a path): it holds only what they are computed from, so a
    bfloat16 model read in float32 never exists as a float32 copy.

    Each read computes the tensor again; read a tensor once per use and let it go.
    ``dict(lazy)`` builds them all.

    Args:
        source: the state dict the tensors are computed from; its keys are the keys.
    """

    def __init__(self, source: Mapping[str, Tensor]) -> None:
        self.source = source

    def __iter__(self) -> Iterator[str]:
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)

    def __contains__(self, key: object) -> bool:
        return key in self.source

    @abstractmethod
    def dtype_of(self, key: str) -> torch.dtype:
        """The dtype ``self[key]`` has, without computing it."""

    def stored_dtype(self, key: str) -> torch.dtype:
        """The dtype ``self[key]`` is stored in, and rounded to once when a result
        computed from it is kept (default: the dtype it is read in)."""
        return self.dtype_of(key)

    def meta(self, key: str) -> Tensor:
        """``self[key]``'s shape and dtype as a tensor on the meta device (default:
        computed once; subclasses that know the shape say so without computing)."""
        return torch.empty_like(self[key], device="meta")

    def rows(self, key: str, start: int, stop: int) -> Tensor:
        """``self[key][start:stop]`` (default: the whole tensor computed, then sliced;
        subclasses that can compute a block of rows alone say so)."""
        return self[key][start:stop]


def dtype_of(params: Mapping[str, Tensor], key: str) -> torch.dtype:
    """The dtype of ``params[key]`` (of a :class:`LazyParams`: without computing it)."""
    return params.dtype_of(key) if isinstance(params, LazyParams) else params[key].dtype


def stored_dtype(params: Mapping[str, Tensor], key: str) -> torch.dtype:
    """The dtype a result computed from ``params[key]`` is kept in: its own, or for a
    :class:`LazyParams` the dtype it is stored in (:meth:`LazyParams.stored_dtype`)."""
    return params.stored_dtype(key) if isinstance(params, LazyParams) else params[key].dtype


def meta_of(params: Mapping[str, Tensor], key: str) -> Tensor:
    """``params[key]``'s shape and dtype as a tensor on the meta device (of a
    :class:`LazyParams`: without computing it)."""
    if isinstance(params, (LazyParams, Float32View)):
        return params.meta(key)
    return torch.empty_like(params[key], device="meta")


def device_of(params: Mapping[str, Tensor]) -> torch.device:
    """The device ``params``' tensors are read on, without computing one (of an empty
    mapping: the CPU)."""
    if isinstance(params, Float32View):
        return params.device
    if isinstance(params, LazyParams):  # computed where its source is
        return device_of(params.source)
    for key in params:
        return params[key].device
    return torch.device("cpu")


def rows_of(params: Mapping[str, Tensor], key: str, start: int, stop: int) -> Tensor:
    """``params[key][start:stop]``, computing no more of a lazy tensor than the rows
    asked for where its mapping can (:meth:`LazyParams.rows`, :meth:`Float32View.rows`)."""
    if isinstance(params, (LazyParams, Float32View)):
        return params.rows(key, start, stop)
    return params[key][start:stop]


def layout(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Every tensor's shape and dtype as a tensor on the meta device, for checks of fit
    that read no values (of a :class:`LazyParams`: without computing the tensors)."""
    return {k: meta_of(params, k) for k in params}


def stored_params(params: Mapping[str, Tensor]) -> Params:
    """A plain state dict of ``params``, each tensor in the dtype it is stored in (of a
    :class:`LazyParams`: computed once and rounded to :meth:`LazyParams.stored_dtype`)."""
    if not isinstance(params, LazyParams):
        return dict(params)
    out = {}
    for key in params:
        value = params[key]
        out[key] = value.to(params.stored_dtype(key)) if value.is_floating_point() else value
    return out


class Float32View(MutableMapping[str, Tensor]):
    """The floating-point tensors of ``params`` read as float32 on ``device``.

    Algorithms that compare models in float32 read their parameters through this view
    instead of copying them: a bfloat16 pair stays in its own bytes and each tensor is
    cast when it is read (a float32 tensor already on ``device`` is returned as it is,
    without a copy). Tensors assigned to the view (rows weighted, products folded) are
    kept as given and shadow the source; the source is never changed, nor read before it
    is needed (a :class:`LazyParams` source computes each tensor when the view reads it).

    Args:
        params: the parameters (integer tensors are left out of the view).
        device: where the float32 tensors are put.
    """

    def __init__(self, params: Mapping[str, Tensor], device: torch.device | str = "cpu") -> None:
        self._source = params
        self._keys = {k: None for k in params if dtype_of(params, k).is_floating_point}
        self.device = torch.device(device)
        self._assigned: dict[str, Tensor] = {}

    def __getitem__(self, name: str) -> Tensor:
        if name in self._assigned:
            return self._assigned[name]
        if name not in self._keys:
            raise KeyError(name)
        return self._source[name].detach().to(self.device, torch.float32)

    def meta(self, name: str) -> Tensor:
        """``self[name]``'s shape and dtype on the meta device, without reading it."""
        if name in self._assigned:
            return torch.empty_like(self._assigned[name], device="meta")
        if name not in self._keys:
            raise KeyError(name)
        return torch.empty(meta_of(self._source, name).shape, dtype=torch.float32, device="meta")

    def rows(self, name: str, start: int, stop: int) -> Tensor:
        """``self[name][start:stop]``, casting only those rows of the source."""
        if name in self._assigned:
            return self._assigned[name][start:stop]
        if name not in self._keys:
            raise KeyError(name)
        return rows_of(self._source, name, start, stop).detach().to(self.device, torch.float32)

    def __setitem__(self, name: str, value: Tensor) -> None:
        self._assigned[name] = value

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._assigned.pop(name, None)
        self._keys.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._assigned or name in self._keys

    def __iter__(self) -> Iterator[str]:
        yield from self._keys
        yield from (k for k in self._assigned if k not in self._keys)

    def __len__(self) -> int:
        return len(self._keys) + sum(k not in self._keys for k in self._assigned)


class IncompatibleModelsError(ValueError):
    """Two parameter sets do not belong to the same architecture."""


def _an(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def as_params(value: object, what: str = "params") -> Mapping[str, Tensor]:
    """``value`` if it is a state dict (a mapping of names to tensors), else a one-line
    ``TypeError`` naming what was given and where the params are.

    The natural mistakes: a loaded checkpoint or model (its ``.params``), a module
    (:func:`module_params`).
    """
    if isinstance(value, LazyParams):  # its values are tensors computed when read: not here
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{what} must map parameter names to tensors; key {key!r}")
        return value
    if isinstance(value, Mapping):
        for key, tensor in value.items():
            if not isinstance(key, str) or not isinstance(tensor, Tensor):
                raise TypeError(
                    f"{what} must map parameter names to tensors; entry {key!r} is {_an(tensor)}"
                )
        return value
    if isinstance(value, torch.nn.Module):
        hint = ": pass lmckit.module_params(module)"
    elif isinstance(getattr(value, "params", None), Mapping):
        hint = ": pass its .params"
    else:
        hint = ""
    raise TypeError(f"{what} must be a dict of tensors (a state dict), got {_an(value)}{hint}")


def as_module(value: object, what: str = "model") -> torch.nn.Module:
    """``value`` if it is an ``nn.Module``, else a one-line ``TypeError`` (a loaded
    checkpoint's or a loaded model's module is its ``.module``)."""
    if isinstance(value, torch.nn.Module):
        return value
    for attr in ("model", "module"):
        if isinstance(getattr(value, attr, None), torch.nn.Module):
            raise TypeError(f"{what} must be an nn.Module, got {_an(value)}: pass its .{attr}")
    raise TypeError(f"{what} must be an nn.Module, got {_an(value)}")


def module_params(module: torch.nn.Module) -> Params:
    """A module's state dict with every tensor once (detached): tied weights keep their
    first key, the one ``named_parameters()`` and ``torch.export`` use.

    This is the form of :data:`Params` lmckit uses for any module: ``functional_call``
    fills the other keys of a tied weight from the first.
    """
    module = as_module(module, "module")
    seen: set[int] = set()
    out: Params = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[name] = tensor.detach()
    return out


def check_compatible(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> None:
    """Raise :class:`IncompatibleModelsError` naming the first mismatched parameter
    (``TypeError`` when either is not a state dict)."""
    as_params(a, "the first model's params")
    as_params(b, "the second model's params")
    for name in a:
        if name not in b:
            raise IncompatibleModelsError(f"parameter {name!r} is in the first model only")
        if a[name].shape != b[name].shape:
            raise IncompatibleModelsError(
                f"parameter {name!r} has shape {tuple(a[name].shape)} in the first model "
                f"and {tuple(b[name].shape)} in the second"
            )
    for name in b:
        if name not in a:
            raise IncompatibleModelsError(f"parameter {name!r} is in the second model only")


def first_nonfinite(
    params: Mapping[str, Tensor], only: Callable[[str], bool] | None = None
) -> str | None:
    """The name of the first floating-point tensor holding a NaN or infinity, or
    ``None`` (with ``only``, among the names it accepts: the others are not read)."""
    for name in params:
        if only is not None and not only(name):
            continue
        value = params[name]
        # one reduction first (NaN and inf propagate through a sum); the elementwise
        # check only runs to rule out an overflow of the sum itself
        if (
            value.is_floating_point()
            and not bool(torch.isfinite(value.sum()))
            and not bool(torch.isfinite(value).all())
        ):
            return name
    return None


def check_finite(params: Mapping[str, Tensor], *, what: str = "parameters") -> None:
    """Raise ``ValueError`` naming the first parameter with a NaN or infinity."""
    name = first_nonfinite(params)
    if name is not None:
        raise ValueError(f"{what}: {name!r} contains NaN or infinite values")


def rounded_finite(value: Tensor, dtype: torch.dtype, *, name: str, what: str) -> Tensor:
    """``value`` rounded to ``dtype``, refusing a NaN or infinity in the result: finite
    values that round to infinity are named as an overflow of ``dtype``'s range (a
    float32 70000 in float16), not as values that were never finite.

    Raises:
        ValueError: ``"{what}: {name!r} overflows ..."`` or ``"... contains NaN or
            infinite values"``.
    """
    out = value.to(dtype)
    if first_nonfinite({name: out}) is None:
        return out
    if out.is_floating_point() and first_nonfinite({name: value}) is None:
        largest = float(value.detach().abs().max())
        raise ValueError(
            f"{what}: {name!r} overflows {dtype}: its values reach {largest:.6g}, beyond "
            f"{dtype}'s largest finite value, {torch.finfo(dtype).max:.6g}"
        )
    raise ValueError(f"{what}: {name!r} contains NaN or infinite values")
