"""How a Hugging Face folder stores its weights: their floating dtype and their shards.

An output keeps its input's storage: the same floating dtype (bfloat16 in, bfloat16 out)
and, for a sharded input, the same shard files holding the same weights, with a
``model.safetensors.index.json``. :func:`stored_layout` reads it from the safetensors
headers and the index (no weights are read); :func:`write_shards` writes tensors into
such a layout one at a time, and :func:`reshard` splits a folder written as one file (or
in other shards) into it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from lmckit.hf._files import read_hf_header, shard_map, weights_path
from lmckit.hf._shardfile import stored_dtype, write_safetensors

__all__ = ["INDEX_FILE", "StoredLayout", "reshard", "stored_layout", "write_index", "write_shards"]

#: The shard index ``transformers`` writes and reads beside safetensors shards.
INDEX_FILE = "model.safetensors.index.json"

#: safetensors dtype names of the floating dtypes a folder may store.
_FLOAT_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


@dataclass(frozen=True)
class StoredLayout:
    """A folder's weight storage.

    Attributes:
        dtype: the floating dtype most of its floating weights are stored in (``None``:
            pickled weights, or no floating weight).
        shards: ``{weight name: shard file}`` of a sharded safetensors folder; ``None``
            for one file.
        dtypes: ``{weight name: dtype}`` of each floating weight as stored: a folder may
            mix them (bfloat16 weights beside float32 norms, as ``transformers`` models
            with ``_keep_in_fp32_modules`` ship), and an output keeps each.
    """

    dtype: torch.dtype | None
    shards: dict[str, str] | None
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)

    def mixed(self) -> dict[torch.dtype, int]:
        """``{dtype: how many weights}`` of the floating dtypes beside the main one."""
        counts = Counter(d for d in self.dtypes.values() if d != self.dtype)
        return dict(counts)


def stored_layout(path: str | os.PathLike[str] | None) -> StoredLayout:
    """The weight storage of the Hugging Face folder at ``path`` (headers only); an
    empty layout for ``None`` (a model held in memory)."""
    if path is None:
        return StoredLayout(None, None)
    header = read_hf_header(path)
    if header is None:
        return StoredLayout(None, None)
    dtypes = {k: _FLOAT_DTYPES[d] for k, (d, _) in header.items() if d in _FLOAT_DTYPES}
    counts = Counter(dtypes.values())
    dtype = counts.most_common(1)[0][0] if counts else None
    file = weights_path(path)
    if not file.name.endswith(".index.json"):
        return StoredLayout(dtype, None, dtypes)
    shards = {key: shard for shard, keys in shard_map(file).items() for key in keys}
    return StoredLayout(dtype, shards, dtypes)


def _written_tensors(folder: Path) -> dict[str, Path]:
    """``{weight name: file}`` of the safetensors weights ``folder`` holds."""
    file = weights_path(folder)
    if file.name.endswith(".index.json"):
        return {k: folder / shard for shard, keys in shard_map(file).items() for k in keys}
    return dict.fromkeys(read_hf_header(folder) or {}, file)


def reshard(folder: Path, shards: dict[str, str]) -> None:
    """Rewrite the safetensors weights in ``folder`` as the shards ``shards`` names.

    A weight the layout does not name (e.g. an LM head written apart after untying) goes
    to the shard of the last weight named. Tensors are moved one at a time (read from
    the memory-mapped files, written by :func:`lmckit.hf._shardfile.write_safetensors`,
    let go), and the old files are removed once the new ones exist.
    """
    where = _written_tensors(folder)
    old_files = set(where.values())
    order = list(dict.fromkeys(shards.values()))
    plan: dict[str, list[str]] = {shard: [] for shard in order}
    for name in where:
        plan[shards.get(name, order[-1])].append(name)
    shapes: dict[str, tuple[torch.dtype, list[int]]] = {}
    for file in old_files:  # the headers only: no tensor is read here
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 -- a safetensors handle, not a dict
                part = f.get_slice(name)
                shapes[name] = (stored_dtype(part.get_dtype()), part.get_shape())

    def read(name: str) -> torch.Tensor:
        # opened per tensor, so that the pages read are unmapped again once it is written
        with safe_open(where[name], framework="pt") as f:
            return f.get_tensor(name)

    weight_map, total = write_shards(folder, plan, shapes, read, suffix=".partial")
    for file in old_files:
        file.unlink()
    index = folder / INDEX_FILE
    if index.exists():
        index.unlink()
    for shard in set(weight_map.values()):
        (folder / (shard + ".partial")).rename(folder / shard)
    write_index(folder, weight_map, total)


def write_shards(
    folder: Path,
    plan: Mapping[str, Sequence[str]],
    shapes: Mapping[str, tuple[torch.dtype, Sequence[int]]],
    read: Callable[[str], torch.Tensor],
    *,
    suffix: str = "",
) -> tuple[dict[str, str], int]:
    """Write each file of ``plan`` (shard file -> the tensor names it holds, in order)
    into ``folder`` (as ``file + suffix``), asking ``read(name)`` for one tensor at a time
    (of the dtype and shape ``shapes`` announces): read, written, let go. Returns the
    weight map (name -> shard file) and the bytes of tensor data."""
    weight_map: dict[str, str] = {}
    total = 0
    for shard, names in plan.items():
        if not names:
            continue
        block = {name: shapes[name] for name in names}
        target = folder / (shard + suffix)
        total += write_safetensors(target, block, read, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, shard))
    return weight_map, total


def write_index(folder: Path, weight_map: Mapping[str, str], total: int) -> None:
    """``model.safetensors.index.json`` of shards holding ``weight_map``'s tensors."""
    doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX_FILE).write_text(json.dumps(doc, indent=2) + "\n")
