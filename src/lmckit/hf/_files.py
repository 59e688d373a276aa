"""The files of a Hugging Face folder: ``config.json`` and the weights, read boundedly and safely.

A Hugging Face folder is a directory whose ``config.json`` is a JSON object with a
``model_type``; its weights are the first of ``model.safetensors``,
``model.safetensors.index.json`` (shards), ``pytorch_model.bin`` and
``pytorch_model.bin.index.json`` that exists (the order ``transformers`` prefers).
Nothing here needs ``transformers``.

Safety: JSON files must be regular files (a symbolic link to one is fine, as in the
hub's cache; a FIFO or device is refused, it could block forever) of bounded size;
pickles are read with ``torch.load(weights_only=True)``, so a pickle that would run
code is refused; shard names must be plain file names inside the folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import KeysView
from pathlib import Path
from typing import Any

from lmckit.formats._bounded import FileLimitError, read_bytes, regular_file
from lmckit.formats._checkpoint import CheckpointError, load_params_file
from lmckit.formats._read_once import ReadOnce
from lmckit.formats._weightfile import safetensors_header
from lmckit.symmetry._params import Params

__all__ = [
    "CONFIG_FILE",
    "MAX_CONFIG_BYTES",
    "MAX_EXTRA_BYTES",
    "MAX_INDEX_BYTES",
    "WEIGHT_FILES",
    "HFError",
    "copy_refusal",
    "is_hf_folder",
    "is_regular_file",
    "read_hf_config",
    "read_hf_header",
    "read_hf_weights",
    "read_json_file",
    "shard_map",
    "weights_path",
]

CONFIG_FILE = "config.json"
#: Weight files of a folder, in the order they are looked for.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: Largest ``config.json`` read (real ones are a few KB; 21k-class label maps ~1 MB).
MAX_CONFIG_BYTES = 4 << 20
#: Largest shard index read (the largest public models' indexes are a few MB).
MAX_INDEX_BYTES = 64 << 20


#: Largest non-weight file copied from a source folder into an output (the tokenizers of
#: the largest vocabularies are tens of MB).
MAX_EXTRA_BYTES = 256 << 20


class HFError(CheckpointError):
    """A Hugging Face folder cannot be read or written; the message names the file and why."""


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is (or links to) a regular file; never raises."""
    try:
        regular_file(path)
    except (OSError, FileLimitError):
        return False
    return True


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def copy_refusal(entry: Path, source: Path) -> str | None:
    """Why the file ``entry`` of the folder ``source`` may not be copied into an output, or
    ``None`` when it may.

    An output may be published: nothing outside the folder the user gave is copied into
    it. A symbolic link is followed only to a file inside ``source`` (or, for a folder of
    the Hugging Face hub's cache, ``.../snapshots/REV``, into that repository's ``blobs``);
    anything but a regular file is not copied, nor a file over :data:`MAX_EXTRA_BYTES`.
    """
    root = Path(os.path.realpath(source))
    target = Path(os.path.realpath(entry))
    if entry.is_symlink():
        blobs = root.parent.parent / "blobs" if root.parent.name == "snapshots" else None
        if not (_within(target, root) or (blobs is not None and _within(target, blobs))):
            return "a symbolic link to a file outside the folder"
    try:
        size = regular_file(target).stat().st_size
    except (OSError, FileLimitError):
        return "not a regular file"
    if size > MAX_EXTRA_BYTES:
        return f"{size:,} bytes, over the {MAX_EXTRA_BYTES:,}-byte limit for copied files"
    return None


def read_json_file(path: str | os.PathLike[str], *, max_bytes: int, what: str) -> Any:
    """The JSON value in a regular file of at most ``max_bytes`` bytes.

    Raises:
        HFError: missing, not a regular file, too large, unreadable or not JSON.
    """
    try:
        data = read_bytes(path, max_bytes=max_bytes, what=what)
    except (FileNotFoundError, FileLimitError) as err:
        raise HFError(str(err)) from None
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise HFError(f"{path} is nested too deeply to be {what}") from None
    except (UnicodeDecodeError, ValueError) as err:  # ValueError: JSONDecodeError and kin
        raise HFError(f"{path} is not valid JSON: {err}") from None


def _read_config(file: Path, max_bytes: int) -> dict[str, Any]:
    config = read_json_file(file, max_bytes=max_bytes, what="config")
    if not isinstance(config, dict):
        raise HFError(f"{file} must hold a JSON object")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise HFError(f"{file} is not a Hugging Face config: it has no 'model_type'")
    return config


#: Each folder's config read once (:mod:`lmckit.formats._read_once`).
_CONFIGS = ReadOnce(_read_config)


def read_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face folder ``path``, as a dict (read once per
    process while the file is unchanged, :mod:`lmckit.formats._read_once`).

    Raises:
        HFError: not a folder, no or a bad ``config.json``, or one without ``model_type``.
    """
    root = Path(path)
    if not root.is_dir():
        raise HFError(f"{root} is not a folder")
    return _CONFIGS(root / CONFIG_FILE, MAX_CONFIG_BYTES)


def is_hf_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder with a Hugging Face ``config.json`` (never raises).

    Only the config is looked at (a ``model_type`` key); the weights are checked when
    the folder is loaded.
    """
    try:
        read_hf_config(path)
    except (HFError, OSError):
        return False
    return True


def weights_path(path: str | os.PathLike[str]) -> Path:
    """The weights file (or shard index) of a Hugging Face folder: see :data:`WEIGHT_FILES`.

    Raises:
        HFError: none of them exists.
    """
    root = Path(path)
    for name in WEIGHT_FILES:
        if (root / name).exists():
            return root / name
    raise HFError(f"{root} holds no weights: expected one of {', '.join(WEIGHT_FILES)}")


def shard_map(index: Path) -> dict[str, set[str]]:
    """``{shard file name: weights it holds}`` from a shard index, names checked."""
    doc = read_json_file(index, max_bytes=MAX_INDEX_BYTES, what="shard index")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise HFError(f"{index} has no 'weight_map' object naming the shards")
    shards: dict[str, set[str]] = {}
    for key, shard in weight_map.items():
        # A shard must be a plain name in this folder: no paths out of it.
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise HFError(f"{index}: weight {key!r} names the shard {shard!r}, not a file name")
        shards.setdefault(shard, set()).add(key)
    for shard in shards:
        if not is_regular_file(index.parent / shard):
            raise HFError(f"{index} names the shard {shard}, which is missing or not a file")
    return shards


def _read_sharded(index: Path, *, check_values: bool) -> Params:
    """The union of the shards an index file names; every listed weight must be found."""
    shards = shard_map(index)
    params: Params = {}
    for shard in sorted(shards):
        part = load_params_file(index.parent / shard, require_finite=check_values)
        _check_shard(index, shard, shards[shard], part.keys(), params.keys())
        params.update(part)
    return params


def _check_shard(
    index: Path, shard: str, listed: set[str], found: KeysView[str], seen: KeysView[str]
) -> None:
    """A shard holds every weight the index places in it, and none another shard holds."""
    file = index.parent / shard
    missing = sorted(listed - found)
    if missing:
        raise HFError(f"{file} lacks {missing[0]!r}, which {index.name} places in it")
    for key in found:
        if key in seen:
            raise HFError(f"{file}: weight {key!r} is also in another shard")


def read_hf_header(path: str | os.PathLike[str]) -> dict[str, tuple[str, tuple[int, ...]]] | None:
    """``{name: (dtype, shape)}`` of a folder's safetensors weights (one file or shards),
    from the headers alone; ``None`` for pickled weights, which have no header.

    Raises:
        HFError / CheckpointError: no weights, a bad index, a corrupt header.
    """
    file = weights_path(path)
    if file.name.endswith(".index.json"):
        if not file.name.startswith("model.safetensors"):
            return None
        out: dict[str, tuple[str, tuple[int, ...]]] = {}
        for shard, keys in sorted(shard_map(file).items()):
            header = safetensors_header(file.parent / shard)
            _check_shard(file, shard, keys, header.keys(), out.keys())
            out.update(header)
        return out
    if file.suffix != ".safetensors":
        return None
    if not is_regular_file(file):
        raise HFError(f"{file} is not a regular file")
    return safetensors_header(file)


def read_hf_weights(path: str | os.PathLike[str], *, check_values: bool = True) -> Params:
    """Every weight of a Hugging Face folder, on the CPU, under its on-disk names and dtypes.

    Safetensors files are memory-mapped: a value is read from disk when it is used.
    ``check_values=False`` skips the check for NaN and infinity, which reads every value
    (for a caller that checks what it reads itself).

    Raises:
        HFError: no weights file. :class:`~lmckit.formats.CheckpointError` (its base
            class): a corrupt or truncated file, a pickle that is not a plain tensor
            state dict (code is never run), or non-finite values.
    """
    file = weights_path(path)
    if file.name.endswith(".index.json"):
        return _read_sharded(file, check_values=check_values)
    if not is_regular_file(file):
        raise HFError(f"{file} is not a regular file")
    return load_params_file(file, require_finite=check_values)
