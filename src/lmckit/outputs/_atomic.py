"""Atomic writes: an output is either the old one or the complete new one, never half-written.

Everything is written to a temporary name in the destination's own directory (so the
final ``os.replace`` / ``os.rename`` stays on one filesystem and is atomic) and moved
into place only when the writer finished without an exception.

A rename replaces whatever has the destination's name, so it is done only onto nothing,
onto what the write is (a regular file for a file, a folder for a folder) or onto a
symbolic link (the link is replaced, never what it points to): a device, a FIFO or a
socket is refused before anything is written and again right before the rename
(:func:`lmckit.outputs.check_replaceable`); ``os.replace`` onto ``/dev/null`` would
replace the device itself.

Temporary names carry the writer's process id: ``.NAME.PID.RANDOM.tmp`` (and ``.old``
for the previous version while a folder is swapped). A run killed with SIGKILL leaves
them behind; the next write to the same place removes those whose writer is dead (on
this machine), and restores a previous folder that a killed swap left only under its
``.old`` name. Leftovers of a live process are never touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lmckit.outputs._places import check_replaceable

__all__ = ["atomic_dir", "atomic_path", "remove_stale", "write_json", "write_text"]


def _sibling(path: Path, tag: str) -> Path:
    # Hidden and unique, so a crash leaves an obvious leftover that never collides
    # with a real output or with a concurrent writer of the same path; the pid tells
    # a later writer whether the one that left it is still running.
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.{tag}")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one we may not signal counts as alive)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_stale(path: str | os.PathLike[str]) -> list[Path]:
    """Clean up what killed writers of ``path`` left beside it; return what was handled.

    ``.tmp`` leftovers of dead processes are deleted. An ``.old`` leftover (the
    previous version, moved aside during a swap) is deleted when ``path`` exists and
    moved back to ``path`` when it does not (the writer died between the two renames).
    Entries of processes still alive, and names not of this form, are left alone.
    """
    target = Path(path)
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(\d+)\.[0-9a-f]{{12}}\.(tmp|old)")
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return []
    handled = []
    for entry in sorted(entries, key=lambda e: e.name):
        match = pattern.fullmatch(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        if match.group(2) == "old" and not (target.exists() or target.is_symlink()):
            os.rename(entry, target)
        else:
            _remove(entry)
        handled.append(entry)
    return handled


def _remove(path: Path) -> None:
    """Delete a file, symlink or directory tree if it exists."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    # Flush every file before the rename, so a crash cannot publish empty files.
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it onto ``path`` on a clean exit.

    The temporary file is not created in advance (so the writer creates it with the
    usual permissions); the body must write it. On an exception the temporary file is
    removed and ``path`` is left as it was. Parent directories are created.

    Raises:
        OutputError: ``path`` is a folder, a device, a FIFO or a socket (checked before
            the body runs and again before the rename).
    """
    target = Path(path)
    check_replaceable(target, folder=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = _sibling(target, "tmp")
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"nothing was written for {target} (expected {tmp})")
        # Flush to disk before the rename, so a crash cannot leave a renamed but empty file.
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        check_replaceable(target, folder=False)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically.

    NaN and infinities are not valid JSON: they raise ``ValueError`` naming ``path``
    (as do unserialisable objects, with ``TypeError``), and nothing is written.
    """
    # Serialise first: a failure then leaves no temporary file at all.
    try:
        text = json.dumps(obj, indent=2, sort_keys=False, allow_nan=False)
    except ValueError as err:
        raise ValueError(f"cannot write {path} as JSON: {err}") from err
    except TypeError as err:
        raise TypeError(f"cannot write {path} as JSON: {err}") from err
    write_text(path, text + "\n")


@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``path``; it becomes ``path`` on a clean exit.

    An existing ``path`` is replaced: it is moved aside, the new directory is moved in,
    then the old one is deleted (if moving the new one in fails, the old one is moved
    back). On an exception the temporary directory is deleted and ``path`` is untouched.

    Raises:
        OutputError: ``path`` is a file, a device, a FIFO or a socket (checked before
            the body runs and again before the rename).
    """
    target = Path(path)
    check_replaceable(target, folder=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = _sibling(target, "tmp")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        _fsync_tree(tmp)
        check_replaceable(target, folder=True)
        if target.exists() or target.is_symlink():
            old = _sibling(target, "old")
            os.rename(target, old)
            try:
                os.rename(tmp, target)
            except BaseException:
                os.rename(old, target)
                raise
            _remove(old)
        else:
            os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
