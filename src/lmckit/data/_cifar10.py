"""CIFAR-10 from the python-pickle batches of ``cifar-10-batches-py``.

The batches are pickles, and unpickling runs whatever callables the file names. They are
therefore read with a restricted unpickler that rebuilds NumPy arrays and nothing else.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmckit.data._dataset import Dataset
from lmckit.formats._bounded import read_bytes

__all__ = ["load_cifar10"]

# Per-channel mean and std of the 50,000 training images after /255.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

_BATCH_RE = re.compile(r"data_batch_(\d+)")
_PIXELS = 3 * 32 * 32
#: Largest batch file read; the real ones are 31 MB.
MAX_BATCH_BYTES = 512 << 20


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    # Python 3 writes bytes under pickle protocol <= 2 as _codecs.encode(str, "latin1").
    # Only that exact use is allowed, so no other codec can be reached through it.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("refusing _codecs.encode other than str -> latin1 bytes")
    return text.encode("latin1")


def _allowed_globals() -> dict[tuple[str, str], Any]:
    # Take the functions NumPy itself names in its pickles from a reduce, so that no
    # deprecated ``numpy.core`` alias is imported whatever the NumPy version.
    reconstruct = np.zeros(0).__reduce__()[0]
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    # NumPy < 2 and the original (Python 2) batches say numpy.core; NumPy >= 2 numpy._core.
    for package in ("numpy.core", "numpy._core"):
        allowed[(f"{package}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{package}.numeric", "_frombuffer")] = frombuffer
    return allowed


class _RefusedGlobal(pickle.UnpicklingError):
    """A pickle named a global outside the allow-list."""


class _BatchUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the globals needed to rebuild plain NumPy arrays."""

    def __init__(self, file: Any, path: Path) -> None:
        # encoding="bytes": the original batches are Python 2 pickles with str keys.
        super().__init__(file, encoding="bytes")
        self._path = path
        self._allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise _RefusedGlobal(
                f"refusing to unpickle {module}.{name} from {self._path}: "
                "not a plain CIFAR-10 batch"
            ) from None


def _get(batch: dict[Any, Any], key: str) -> Any:
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise KeyError(key)


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(data uint8 (N, 3072), labels int64 (N,))`` of one batch file."""
    # Read whole (bounded) first: a pickle's declared lengths then cannot exceed the file.
    raw = read_bytes(path, max_bytes=MAX_BATCH_BYTES, what="CIFAR-10 batch")
    with io.BytesIO(raw) as f:
        try:
            batch = _BatchUnpickler(f, path).load()
        except _RefusedGlobal as err:
            raise ValueError(str(err)) from None
        # A damaged pickle can fail in many ways (EOFError, UnpicklingError, KeyError on a
        # memo, TypeError inside NumPy's setstate ...): all mean the file is unusable.
        except Exception as err:
            raise ValueError(f"{path}: corrupt or truncated pickle ({err})") from err
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a dict, got {type(batch).__name__}")
    try:
        data, labels = _get(batch, "data"), _get(batch, "labels")
    except KeyError as err:
        raise ValueError(f"{path}: batch has no {err.args[0]!r} entry") from None
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise ValueError(f"{path}: 'data' must be a 2-D uint8 array")
    if data.shape[1] != _PIXELS:
        raise ValueError(f"{path}: 'data' rows must hold {_PIXELS} pixels, got {data.shape[1]}")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: 'labels' are not integers ({err})") from None
    if labels.shape != (data.shape[0],):
        raise ValueError(f"{path}: {labels.shape} labels for {data.shape[0]} images")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{path}: labels outside 0..9")
    return data, labels


def _to_tensors(data: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    # Each row is 1,024 red, then green, then blue pixels, each plane row-major 32x32.
    x = torch.from_numpy(data).reshape(-1, 3, 32, 32).to(torch.float32).div_(255.0)
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std), torch.from_numpy(labels)


def load_cifar10(path: str | os.PathLike[str]) -> Dataset:
    """CIFAR-10 as ``(3, 32, 32)`` images, /255 then normalised per channel.

    Args:
        path: directory holding ``test_batch`` and at least one of ``data_batch_1`` ..
            ``data_batch_5`` (those present are concatenated in numeric order).

    Raises:
        FileNotFoundError: listing the files looked for.
        ValueError: on a corrupt batch, or a pickle that names anything but NumPy arrays.
    """
    root = Path(path).expanduser()
    numbered = []
    for p in root.iterdir() if root.is_dir() else ():
        match = _BATCH_RE.fullmatch(p.name)
        if match and p.is_file():
            numbered.append((int(match.group(1)), p))
    train_files = [p for _, p in sorted(numbered)]
    test_file = root / "test_batch"
    if not train_files or not test_file.is_file():
        raise FileNotFoundError(
            f"no CIFAR-10 batches in {root}: looked for data_batch_1 .. data_batch_5 "
            "(at least one) and test_batch, as in cifar-10-batches-py"
        )
    parts = [_read_batch(p) for p in train_files]
    x_train, y_train = _to_tensors(
        np.concatenate([d for d, _ in parts]), np.concatenate([l for _, l in parts])
    )
    x_test, y_test = _to_tensors(*_read_batch(test_file))
    return Dataset("cifar10", x_train, y_train, x_test, y_test, num_classes=10)
