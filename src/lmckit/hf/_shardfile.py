"""A safetensors file written one tensor at a time.

``safetensors.torch.save_file`` takes every tensor of the file at once and turns each
into bytes before writing: a 500 MB shard costs its tensors plus as many bytes again.
Resharding a written model (:func:`lmckit.hf._layout.reshard`) reads each tensor from a
memory-mapped file, so :func:`write_safetensors` asks for one tensor at a time, writes
its bytes, and lets it go: the cost is the largest tensor, not the shard.

The format (as ``safetensors`` reads it): an 8-byte little-endian header length, a JSON
header naming each tensor's dtype, shape and ``[begin, end)`` byte offsets into the data
that follows (in order, without gaps), padded with spaces to a multiple of 8 bytes, then
the tensors' bytes, little-endian, row-major.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["stored_dtype", "write_safetensors"]

#: torch dtype -> safetensors' name for it
_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip


def stored_dtype(code: str) -> torch.dtype:
    """The torch dtype of safetensors' dtype name ``code`` (``"BF16"``, ...)."""
    for dtype, name in _DTYPES.items():
        if name == code:
            return dtype
    raise ValueError(f"safetensors dtype {code!r} has no torch dtype here")


def write_safetensors(
    path: Path,
    shapes: Mapping[str, tuple[torch.dtype, Sequence[int]]],
    tensor: Callable[[str], Tensor],
    *,
    metadata: Mapping[str, str] | None = None,
) -> int:
    """Write the tensors named in ``shapes`` (name -> dtype and shape, in file order) to
    ``path``, asking ``tensor(name)`` for each in turn. Returns the bytes of tensor data.

    Raises:
        ValueError: a dtype safetensors has no name for, or a tensor that is not the
            dtype and shape announced.
    """
    if sys.byteorder != "little":  # the format is little-endian; so are tensors here
        raise ValueError("writing safetensors needs a little-endian machine")
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    at = 0
    for name, (dtype, shape) in shapes.items():
        if dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r}: safetensors cannot store {dtype}")
        size = torch.Size(shape).numel() * dtype.itemsize
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [at, at + size]}  # fmt: skip
        at += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, (dtype, shape) in shapes.items():
            value = tensor(name)
            if value.dtype != dtype or tuple(value.shape) != tuple(shape):
                raise ValueError(
                    f"tensor {name!r} is {value.dtype} {tuple(value.shape)}, announced as "
                    f"{dtype} {tuple(shape)}"
                )
            flat = value.detach().cpu().contiguous().reshape(-1)
            if flat.numel():
                f.write(flat.view(torch.uint8).numpy().data)
            del value, flat
    return at
