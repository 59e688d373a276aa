"""A safetensors file written one tensor at a time reads back as safetensors writes it."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lmckit.hf._shardfile import stored_dtype, write_safetensors


def test_every_dtype_and_shape_reads_back_with_its_metadata(tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(5, 3, generator=gen).bfloat16(),
        "h": torch.randn(7, generator=gen).half(),
        "d": torch.randn(2, 2, generator=gen, dtype=torch.float64),
        "f": torch.randn(4, 3, generator=gen).t(),  # not contiguous
        "n": torch.tensor(3),
        "e": torch.zeros(0, 4),
        "b": torch.tensor([True, False, True]),
    }
    asked: list[str] = []

    def read(name: str) -> torch.Tensor:
        asked.append(name)
        return tensors[name]

    shapes = {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}
    path = tmp_path / "x.safetensors"
    size = write_safetensors(path, shapes, read, metadata={"format": "pt"})
    back = load_file(path)
    assert back.keys() == tensors.keys() and asked == list(tensors)  # each read once
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    assert size == sum(v.numel() * v.element_size() for v in tensors.values())
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert stored_dtype(f.get_slice("w").get_dtype()) == torch.bfloat16


def test_a_tensor_unlike_its_announcement_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="announced as"):
        write_safetensors(
            tmp_path / "x.safetensors", {"w": (torch.float32, (2, 2))}, lambda n: torch.ones(3)
        )
    with pytest.raises(ValueError, match="cannot store"):
        write_safetensors(
            tmp_path / "y.safetensors", {"w": (torch.complex64, (1,))}, lambda n: torch.ones(1)
        )
