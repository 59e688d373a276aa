"""Parameters computed when read, put into a module layer by layer as its forward pass
reaches each module.

A whole float32 point of a path between two bfloat16 models is as large as both models
together. :class:`LinearPoint` holds only its ends and ``t``: each tensor is computed
when it is read (exactly as :func:`lmckit.symmetry.interpolate` computes it).
:func:`streamed_call` runs a module on such a point (or on any
:class:`~lmckit.symmetry._params.LazyParams`) without building it: a hook before
each module's forward puts that module's own tensors of the point in place, and one
after its forward takes them out again, so one module's worth of the point exists at a
time (recomputed for every batch: a forward pass costs far more per weight).

Every swapped tensor is replaced by an empty tensor of the point's dtype for the whole
call: a module that reads another module's weight (a head tied to an embedding and used
by its parent, say) fails on it instead of reading a wrong value, and the caller builds
the point whole instead (:mod:`lmckit.measure._batched`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.symmetry._average import average_tensor
from lmckit.symmetry._params import LazyParams
from lmckit.symmetry._params import dtype_of as read_dtype

__all__ = ["STREAM_BYTES", "LinearPoint", "streamed_call"]

#: points whose floating tensors take more bytes than this are streamed on the CPU
#: (smaller ones are built whole: rebuilding them for every batch is not worth it)
STREAM_BYTES = 2**28


class LinearPoint(LazyParams):
    """``(1 - t) a + t b``, each tensor computed when read (``dtype``: of the floating
    tensors, default the stored one; integer tensors come from ``a``)."""

    def __init__(
        self, a: Mapping[str, Tensor], b: Mapping[str, Tensor], t: float, dtype: torch.dtype | None
    ) -> None:
        super().__init__(a)
        self.a, self.b, self.t, self.dtype = a, b, t, dtype

    def __getitem__(self, key: str) -> Tensor:
        return average_tensor([self.a[key], self.b[key]], [1.0 - self.t, self.t], dtype=self.dtype)

    def nbytes(self) -> int:
        """Bytes of the point's floating tensors, were it built whole."""
        out = 0
        for v in self.a.values():
            if v.is_floating_point():
                item = (self.dtype or v.dtype).itemsize
                out += v.numel() * item
        return out

    def dtype_of(self, key: str) -> torch.dtype:
        dtype = read_dtype(self.a, key)
        return (self.dtype or dtype) if dtype.is_floating_point else dtype


def _slots(model: nn.Module, point: LazyParams) -> dict[nn.Module, list[tuple[str, str, bool]]]:
    """Per module, ``(local name, key in point, is a buffer)`` of its own tensors that the
    point holds; a tensor tied under several names takes the name the point holds."""
    names: dict[int, str] = {}
    for name, value in [*model.named_parameters(remove_duplicate=False),
                        *model.named_buffers(remove_duplicate=False)]:  # fmt: skip
        if name in point:
            names.setdefault(id(value), name)
    out: dict[nn.Module, list[tuple[str, str, bool]]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        if module in out:  # a module used under two names: its tensors are found once
            continue
        for table, buffer in ((module._parameters, False), (module._buffers, True)):
            for local, value in table.items():
                key = f"{prefix}.{local}" if prefix else local
                key = key if key in point else names.get(id(value), "")
                if value is not None and key:
                    out.setdefault(module, []).append((local, key, buffer))
    return out


def _table(module: nn.Module, buffer: bool) -> dict[str, Any]:
    """The module's own parameters or buffers by name (plain tensors are put there)."""
    return module._buffers if buffer else module._parameters


@contextmanager
def _streaming(model: nn.Module, point: LazyParams) -> Iterator[None]:
    slots = _slots(model, point)
    originals = [
        (table, local, table[local])
        for module, entries in slots.items()
        for local, _, buffer in entries
        for table in [_table(module, buffer)]
    ]
    device = next((v.device for _, _, v in originals if v is not None), torch.device("cpu"))

    def put(module: nn.Module, built: bool) -> None:
        for local, key, buffer in slots[module]:
            table = _table(module, buffer)
            if built:
                table[local] = point[key].to(device)
            else:
                table[local] = torch.empty(0, dtype=point.dtype_of(key), device=device)

    def before(module: nn.Module, _args: object) -> None:
        put(module, True)

    def after(module: nn.Module, _args: object, _out: object) -> None:
        put(module, False)

    handles = []
    try:
        for module in slots:
            put(module, False)
            handles.append(module.register_forward_pre_hook(before))
            handles.append(module.register_forward_hook(after))
        yield
    finally:
        for h in handles:
            h.remove()
        for table, local, value in originals:
            table[local] = value


def streamed_call(model: nn.Module, point: LazyParams, *args: Any, **kwargs: Any) -> Any:
    """``model(*args, **kwargs)`` with ``point``'s tensors, each module's built only while
    it runs.

    Raises whatever the module raises when one of its modules reads a tensor of another
    outside that module's forward (an empty tensor stands there).
    """
    with _streaming(model, point):
        return model(*args, **kwargs)
