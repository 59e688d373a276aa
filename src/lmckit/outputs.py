"""Where results may be written: never over an input, never over a folder lmckit did not make.

Every command that writes checks its outputs *before* it computes anything:

* an output may not be, contain, or lie inside one of the command's inputs (checkpoints,
  data files and folders), whatever ``force`` says;
* an output folder that exists must be empty or an lmckit output of the same kind
  (a checkpoint written by lmckit holding only the files lmckit writes, or an
  experiment folder carrying lmckit's run marker); anything else is refused unless
  ``force`` is given, and the current working directory and its ancestors never;
* the place must be writable: a probe file is created and removed in the nearest
  existing ancestor.

The writes themselves are atomic (:mod:`lmckit.atomic`); this module decides whether a
write is allowed at all.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

__all__ = [
    "CHECKPOINT_FILES",
    "HF_MARKER",
    "RUN_MARKER",
    "OutputError",
    "OutputKind",
    "check_output_dir",
    "check_output_file",
    "is_lmckit_output",
]

OutputKind = Literal["checkpoint", "experiment", "hf"]

#: Entries of a checkpoint folder lmckit writes (``reference/``: ``align``'s rewritten A).
CHECKPOINT_FILES = frozenset({"config.json", "model.safetensors", "reference"})
#: File an experiment folder gets before anything else is written into it.
RUN_MARKER = "lmckit-run.json"
#: File a Hugging Face folder written by lmckit carries; its ``files`` lists what lmckit wrote.
HF_MARKER = "lmckit.json"
# Marker and config files are tiny; a larger one is not ours (and is not read whole).
_MAX_MARKER_BYTES = 1 << 20


class OutputError(ValueError):
    """An output target is refused; the message names it and says why."""


def _real(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def _inside(child: Path, parent: Path) -> bool:
    """Whether ``child`` is ``parent`` or lies below it (both resolved)."""
    return child == parent or parent in child.parents


def _read_small_json(path: Path) -> object:
    """The JSON in a small regular file, or ``None`` (missing, too big, not JSON)."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_MARKER_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None


def is_lmckit_output(path: str | os.PathLike[str], kind: OutputKind) -> bool:
    """Whether ``path`` is a folder lmckit wrote as an output of ``kind``.

    A checkpoint: ``config.json`` with an ``lmckit_version`` key, and no entries but
    those lmckit writes (so replacing it cannot delete a user's file). An experiment
    folder: the run marker :data:`RUN_MARKER`. A Hugging Face folder (``"hf"``): the
    marker :data:`HF_MARKER`, whose ``files`` list names every entry of the folder.
    """
    folder = Path(path)
    if folder.is_symlink() or not folder.is_dir():
        return False
    if kind == "checkpoint":
        config = _read_small_json(folder / "config.json")
        if not isinstance(config, dict) or "lmckit_version" not in config:
            return False
        return all(entry.name in CHECKPOINT_FILES for entry in folder.iterdir())
    if kind == "hf":
        marker = _read_small_json(folder / HF_MARKER)
        files = marker.get("files") if isinstance(marker, dict) else None
        # align writes the reference form of the first model beside the weights
        return isinstance(files, list) and all(
            e.name in files or e.name == "reference" for e in folder.iterdir()
        )
    marker = _read_small_json(folder / RUN_MARKER)
    return isinstance(marker, dict) and "experiment" in marker


def _check_inputs(out: Path, inputs: Iterable[str | os.PathLike[str]], what: str) -> None:
    for raw in inputs:
        inp = _real(raw)
        if out == inp:
            raise OutputError(f"refusing to write {what} {out}: it is an input of this command")
        if _inside(out, inp):
            raise OutputError(f"refusing to write {what} {out}: it lies inside the input {inp}")
        if _inside(inp, out):
            raise OutputError(
                f"refusing to write {what} {out}: it contains the input {inp}, which "
                "writing it would destroy"
            )


def _check_writable(target: Path, what: str) -> None:
    """Create and remove a probe file in the nearest existing ancestor of ``target``."""
    ancestor = target.parent
    while not ancestor.exists():
        if ancestor.parent == ancestor:
            break
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"cannot write {what} {target}: {ancestor} is not a folder")
    probe = ancestor / f".lmckit-write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.touch(exist_ok=False)
    except OSError as err:
        reason = err.strerror or str(err)
        raise OutputError(
            f"cannot write {what} {target}: {ancestor} is not writable ({reason})"
        ) from None
    finally:
        probe.unlink(missing_ok=True)


def _example_entries(folder: Path, limit: int = 3) -> str:
    names = sorted(entry.name for entry in folder.iterdir())
    shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}: {shown}"


def _named_output(
    path: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]], what: str
) -> tuple[Path, Path]:
    """``path`` as given and resolved, after refusing an empty path or an overlap with
    ``inputs`` (``what`` names the output in errors)."""
    text = os.fspath(path)
    if not text.strip():
        raise OutputError(f"the {what} is an empty path")
    target = Path(text)
    out = _real(target)
    _check_inputs(out, inputs, what)
    return target, out


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
            output of ``kind`` (never an input, never the working directory).

    Raises:
        OutputError: naming the folder and the reason.
    """
    what = "output folder"
    target, out = _named_output(path, inputs, what)
    if _inside(_real(Path.cwd()), out):
        raise OutputError(
            f"refusing to write {what} {target}: it is the current working directory "
            "or one of its parents; name a new folder"
        )
    if target.is_symlink():
        if not force:
            raise OutputError(
                f"refusing to replace {target}: it is a symbolic link (pass --force to replace "
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
            }[kind]
            raise OutputError(
                f"refusing to replace {target}: it is not {made} "
                f"({_example_entries(target)}); choose a new folder or pass --force"
            )
    _check_writable(out, what)
    return target


def check_output_file(
    path: str | os.PathLike[str],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    suffixes: Iterable[str] | None = None,
) -> Path:
    """Validate an output file (``--json``, ``--plot``) before any work.

    An existing regular file at ``path`` is replaced (the user named it); a folder, an
    input, or a file inside an input folder is refused, as is a suffix outside
    ``suffixes`` (e.g. the image formats a plot can be saved in).

    Raises:
        OutputError: naming the file and the reason.
    """
    what = "output file"
    target, out = _named_output(path, inputs, what)
    if suffixes is not None:
        allowed = sorted({s.lower() for s in suffixes})
        if target.suffix.lower() not in allowed:
            raise OutputError(
                f"cannot write {target}: unknown file type {target.suffix or '(none)'!r}; "
                f"use one of {', '.join(allowed)}"
            )
    if target.is_dir():
        raise OutputError(f"cannot write {what} {target}: it is a folder")
    _check_writable(out, what)
    return target
