"""Each input file read once per process: what a file gave, kept by the file's identity.

A command asks about its inputs in several places: whether a folder is a Hugging Face
one, its config when the model is built, when two configs are compared and when the
output's config is written; a weights file's header when the config is checked against
it, when the storage layout is read and when the output is written in that layout. The
answers depend on the file alone: :class:`ReadOnce` keeps the last answers by the file's
identity (device, inode, size and modification time, from one ``stat``, which opens
nothing), so that a file is opened once however often it is asked about, and read again
if it changed. Failures are not kept: a file that cannot be read is tried again.
"""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

__all__ = ["ReadOnce", "file_identity"]

T = TypeVar("T")


def file_identity(path: str | os.PathLike[str]) -> Hashable | None:
    """``(path, device, inode, size, mtime)`` of the file ``path`` leads to, or ``None``
    when it cannot be stat'ed (the reader then reports why)."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        return None
    where = os.path.realpath(path)
    return (where, found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)


class ReadOnce(Generic[T]):
    """``read(path, *limits)``, answered from what an earlier call read from the same
    file under the same limits (a size bound: a file read under a larger one is read
    again, and refused, under a smaller one).

    Each call returns its own copy (a caller may change what it is given).

    Args:
        read: the reader (raises on a file it refuses; nothing is kept then).
        kept: how many files' answers are kept (the oldest is forgotten first).
    """

    def __init__(self, read: Callable[..., T], *, kept: int = 32) -> None:
        self._read = read
        self._kept = kept
        self._answers: OrderedDict[Hashable, T] = OrderedDict()

    def __call__(self, path: str | os.PathLike[str], *limits: Hashable) -> T:
        identity = file_identity(path)
        if identity is None:
            return self._read(Path(path), *limits)
        key = (identity, limits)
        if key not in self._answers:
            self._answers[key] = self._read(Path(path), *limits)
            while len(self._answers) > self._kept:
                self._answers.popitem(last=False)
        self._answers.move_to_end(key)
        return copy.deepcopy(self._answers[key])

    def clear(self) -> None:
        """Forget every answer."""
        self._answers.clear()
