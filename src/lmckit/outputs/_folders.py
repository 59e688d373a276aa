"""Output folders: an existing one is replaced only if lmckit wrote it, or with ``force``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from lmckit.outputs._places import (
    FORCE_HINT,
    OutputError,
    check_protected,
    check_writable,
    named_output,
)

__all__ = [
    "CHECKPOINT_FILES",
    "CURVE_MARKER",
    "HF_MARKER",
    "REFERENCE_DIR",
    "RUN_MARKER",
    "OutputKind",
    "check_no_links",
    "check_output_dir",
    "is_lmckit_output",
]

OutputKind = Literal["checkpoint", "experiment", "hf", "curve"]

#: Files of a checkpoint folder lmckit writes.
CHECKPOINT_FILES = frozenset({"config.json", "model.safetensors"})
#: The one subfolder an lmckit output may hold: ``align``'s A in the form B was aligned
#: in, itself an lmckit checkpoint or Hugging Face folder (holding no subfolder).
REFERENCE_DIR = "reference"
#: File an experiment folder gets before anything else is written into it.
RUN_MARKER = "lmckit-run.json"
#: File a Hugging Face folder written by lmckit carries; its ``files`` lists what lmckit wrote.
HF_MARKER = "lmckit.json"
#: File a curve folder (``lmckit curve``) carries; its ``folders`` lists the points it holds,
#: each an lmckit checkpoint or Hugging Face folder.
CURVE_MARKER = "lmckit-curve.json"
# Marker and config files are tiny; a larger one is not ours (and is not read whole).
_MAX_MARKER_BYTES = 1 << 20


def _read_small_json(path: Path) -> object:
    """The JSON in a small regular file, or ``None`` (missing, too big, not JSON)."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_MARKER_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None


def _regular(path: Path) -> bool:
    """A regular file itself (not a link to one, not a folder)."""
    return path.is_file() and not path.is_symlink()


def _own_files(folder: Path, kind: OutputKind) -> frozenset[str] | None:
    """The files lmckit says it wrote in ``folder`` as an output of ``kind``, or ``None``
    when ``folder`` carries no such claim (no lmckit config, no marker)."""
    if kind == "checkpoint":
        config = _read_small_json(folder / "config.json")
        own = isinstance(config, dict) and "lmckit_version" in config
        return CHECKPOINT_FILES if own else None
    if kind == "hf":
        marker = _read_small_json(folder / HF_MARKER)
        files = marker.get("files") if isinstance(marker, dict) else None
        if isinstance(files, list) and all(isinstance(f, str) for f in files):
            return frozenset(files)
    return None


def _foreign_entries(folder: Path, kind: OutputKind, *, nested: bool) -> list[str] | None:
    """Entries of ``folder`` lmckit did not write as an output of ``kind`` (``None``: the
    folder does not claim to be one). Only regular files lmckit lists count as its own,
    and, if ``nested``, a :data:`REFERENCE_DIR` that is itself an lmckit output."""
    files = _own_files(folder, kind)
    if files is None:
        return None
    foreign = []
    for entry in folder.iterdir():
        if entry.name in files and _regular(entry):
            continue
        if nested and entry.name == REFERENCE_DIR and _own_reference(entry):
            continue
        foreign.append(entry.name)
    return foreign


def _own_reference(folder: Path) -> bool:
    """Whether ``folder`` (a ``reference/`` entry) is an lmckit output with no subfolder."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return any(_foreign_entries(folder, kind, nested=False) == [] for kind in ("checkpoint", "hf"))


def _own_curve(folder: Path) -> bool:
    """Whether ``folder`` holds only its curve marker and the point folders it lists, each
    an lmckit checkpoint or Hugging Face folder (with no subfolder)."""
    marker = _read_small_json(folder / CURVE_MARKER)
    listed = marker.get("folders") if isinstance(marker, dict) else None
    if not isinstance(listed, list) or not all(isinstance(f, str) for f in listed):
        return False
    try:
        entries = list(folder.iterdir())  # read whole: a half-read listing stays open
        return all(
            (entry.name == CURVE_MARKER and _regular(entry))
            or (entry.name in listed and _own_reference(entry))
            for entry in entries
        )
    except OSError:  # an unreadable folder is not known to be ours
        return False


def is_lmckit_output(path: str | os.PathLike[str], kind: OutputKind) -> bool:
    """Whether ``path`` is a folder lmckit wrote as an output of ``kind``.

    A checkpoint: ``config.json`` with an ``lmckit_version`` key, and no entries but
    the regular files lmckit writes (so replacing it cannot delete a user's file). A
    Hugging Face folder (``"hf"``): the marker :data:`HF_MARKER`, whose ``files`` list
    names every entry of the folder, each a regular file. An experiment folder: the run
    marker :data:`RUN_MARKER`. A curve folder (``"curve"``): the marker
    :data:`CURVE_MARKER` and the point folders its ``folders`` lists, each an lmckit
    checkpoint or Hugging Face folder. A checkpoint or Hugging Face folder may also hold
    :data:`REFERENCE_DIR`, which must itself be such an output (with no subfolder of
    its own): a user's folder of that name is not lmckit's.
    """
    folder = Path(path)
    if folder.is_symlink() or not folder.is_dir():
        return False
    if kind == "experiment":
        marker = _read_small_json(folder / RUN_MARKER)
        return isinstance(marker, dict) and "experiment" in marker
    if kind == "curve":
        return _own_curve(folder)
    try:
        return _foreign_entries(folder, kind, nested=True) == []
    except OSError:  # an unreadable folder is not known to be ours
        return False


def check_no_links(folder: str | os.PathLike[str]) -> None:
    """Refuse a folder lmckit fills in place (an experiment's) that is, or holds, a
    symbolic link: lmckit never writes through a link into what it points to.

    Raises:
        OutputError: naming the first link found.
    """
    root = Path(folder)
    if root.is_symlink():
        raise OutputError(
            f"refusing to write into {root}: it is a symbolic link (to "
            f"{os.readlink(root)}); lmckit writes only into a real folder, name it instead"
        )
    if not root.is_dir():
        return
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            entry = Path(dirpath) / name
            if entry.is_symlink():
                raise OutputError(
                    f"refusing to write into {root}: {entry} is a symbolic link (to "
                    f"{os.readlink(entry)}) lmckit did not make, and lmckit never writes "
                    "through a link; remove it or choose a new folder"
                )


def _example_entries(folder: Path, limit: int = 3) -> str:
    names = sorted(entry.name for entry in folder.iterdir())
    shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}: {shown}"


def check_output_dir(
    path: str | os.PathLike[str],
    *,
    kind: OutputKind,
    inputs: Iterable[str | os.PathLike[str]] = (),
    force: bool = False,
) -> Path:
    """Validate an output folder before any work; return it as given (not resolved).

    Args:
        path: the folder to write (it will be replaced as a whole, or filled).
        kind: what lmckit writes there; an existing lmckit output of this kind may be
            replaced.
        inputs: paths the command reads; the output may not overlap any of them.
        force: allow replacing an existing non-empty folder that is not an lmckit
            output of ``kind`` (never an input, never the working directory, the home
            folder or one of their parents); the command line's ``--force``, the
            library writers' ``overwrite``.

    Raises:
        OutputError: naming the folder and the reason.
    """
    what = "output folder"
    target, out = named_output(path, inputs, what)
    check_protected(target, out, what)
    if target.is_symlink():
        if not force:
            raise OutputError(
                f"refusing to replace {target}: it is a symbolic link ({FORCE_HINT} to replace "
                "the link itself; what it points to is left alone)"
            )
    elif target.exists():
        if not target.is_dir():
            raise OutputError(f"refusing to write {what} {target}: a file of that name exists")
        empty = not any(target.iterdir())
        if not empty and not is_lmckit_output(target, kind) and not force:
            made = {
                "checkpoint": "an lmckit checkpoint",
                "experiment": "an lmckit experiment folder",
                "hf": "a Hugging Face folder lmckit wrote",
                "curve": "a curve folder lmckit wrote",
            }[kind]
            try:
                foreign = _foreign_entries(target, kind, nested=True)
            except OSError:
                foreign = None
            if foreign == [REFERENCE_DIR]:
                # lmckit's own output but for a reference/ folder that is not lmckit's
                raise OutputError(
                    f"refusing to replace {target}: its {REFERENCE_DIR}/ is not a folder "
                    f"lmckit wrote ({_example_entries(target / REFERENCE_DIR)}); choose a "
                    f"new folder or {FORCE_HINT}"
                )
            raise OutputError(
                f"refusing to replace {target}: it is not {made} "
                f"({_example_entries(target)}); choose a new folder or {FORCE_HINT}"
            )
    if kind == "experiment":  # filled in place, not replaced: no link to write through
        check_no_links(target)
    check_writable(out, what)
    return target
