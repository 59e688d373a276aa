"""A model whose tensors are read lazily, recording which were read."""

from __future__ import annotations

import torch

from lmckit.symmetry._params import LazyParams


class RecordedParams(LazyParams):
    """``source``'s tensors, read lazily; ``reads`` holds the names of those read (their
    values: shapes and dtypes come from ``meta`` and ``dtype_of``, which read nothing)."""

    def __init__(self, source: dict[str, torch.Tensor]) -> None:
        super().__init__(source)
        self.reads: set[str] = set()

    def __getitem__(self, key: str) -> torch.Tensor:
        self.reads.add(key)
        return self.source[key]

    def dtype_of(self, key: str) -> torch.dtype:
        return self.source[key].dtype

    def meta(self, key: str) -> torch.Tensor:
        return torch.empty_like(self.source[key], device="meta")
