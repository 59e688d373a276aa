"""Where results may be written: the one output policy of every writer, library and CLI alike.

Every writer (``lmckit.save``, ``lmckit.save_model``, the Hugging Face writer, plots, every
command) checks its outputs here *before* it writes, and every command also before it
computes anything:

* an output may not be, contain, or lie inside one of the command's inputs (checkpoints,
  data files and folders), whatever ``force`` says;
* the current working directory and its ancestors are never an output folder;
* an output folder that exists must be empty or an lmckit output of the same kind
  (a checkpoint written by lmckit holding only the files lmckit writes, a Hugging Face
  folder whose ``lmckit.json`` lists every entry, or an experiment folder carrying
  lmckit's run marker, or a curve folder whose marker lists every entry); a subfolder
  such an output may hold (``reference/``, a curve's points) must itself be lmckit's,
  and every listed entry must be the regular file it claims to be;
  anything else is refused unless ``force`` is given (``--force`` on the command line,
  ``overwrite=True`` in Python);
* two outputs of one command never share a path, nor lie one inside the other;
* the place must be writable: a probe file is created and removed in the nearest
  existing ancestor.

The writes themselves are atomic (:mod:`lmckit.atomic`); this module decides whether a
write is allowed at all.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

__all__ = [
    "CHECKPOINT_FILES",
    "CURVE_MARKER",
    "HF_MARKER",
    "RUN_MARKER",
    "OutputError",
    "OutputKind",
    "REFERENCE_DIR",
    "check_distinct_outputs",
    "check_output_dir",
    "check_output_file",
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


_FORCE = "pass --force (overwrite=True in Python)"


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
            output of ``kind`` (never an input, never the working directory); the
            command line's ``--force``, the library writers' ``overwrite``.

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
                f"refusing to replace {target}: it is a symbolic link ({_FORCE} to replace "
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
                    f"new folder or {_FORCE}"
                )
            raise OutputError(
                f"refusing to replace {target}: it is not {made} "
                f"({_example_entries(target)}); choose a new folder or {_FORCE}"
            )
    _check_writable(out, what)
    return target


def check_distinct_outputs(outputs: Mapping[str, str | os.PathLike[str] | None]) -> None:
    """Two outputs of one command never share a path, nor lie one inside the other.

    Args:
        outputs: each output's name as the user gave it (``"--json"``) and its path;
            ``None`` entries (not asked for) are skipped.

    Raises:
        OutputError: naming both outputs and the path.
    """
    named = [(name, _real(path)) for name, path in outputs.items() if path is not None]
    for i, (name_a, a) in enumerate(named):
        for name_b, b in named[i + 1 :]:
            if a == b:
                raise OutputError(
                    f"{name_a} and {name_b} both name {a}: one would overwrite the other; "
                    "give each its own path"
                )
            if _inside(a, b) or _inside(b, a):
                inner, outer = (name_a, name_b) if _inside(a, b) else (name_b, name_a)
                raise OutputError(f"{inner} lies inside {outer} ({a}, {b}); give each its own path")


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
