"""Output files (``--json``, ``--plot``, a module's weights): what an existing one may be."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from lmckit.outputs._folders import HF_MARKER
from lmckit.outputs._own_files import FileKind, written_by_lmckit
from lmckit.outputs._places import (
    FORCE_HINT,
    OutputError,
    check_writable,
    entry_kind,
    named_output,
)

__all__ = ["MODEL_WEIGHT_FILES", "check_output_file"]

#: Weight files that, beside a ``config.json``, make a folder a model (an lmckit
#: checkpoint's or a Hugging Face folder's): nothing else is ever written inside it.
MODEL_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "model.pt",
    "model.pth",
    "model.bin",
)


def _model_folder(folder: Path) -> bool:
    """A folder holding a model: ``config.json`` beside weights, or lmckit's marker."""
    if (folder / HF_MARKER).is_file():
        return True
    return (folder / "config.json").is_file() and any(
        (folder / name).exists() for name in MODEL_WEIGHT_FILES
    )


def _check_not_in_model(target: Path, out: Path, what: str) -> None:
    for folder in out.parents:
        if _model_folder(folder):
            raise OutputError(
                f"refusing to write {what} {target}: {folder} is a model folder (a config "
                "and its weights), and a file written into it would change or corrupt the "
                "model; write it beside the folder"
            )


def _check_existing_file(target: Path, what: str, *, force: bool, kind: FileKind) -> None:
    """The rule for an existing output file (see the module's docstring)."""
    found = entry_kind(target)
    if found is None:
        return
    if found == "a symbolic link":
        if not force:
            raise OutputError(
                f"refusing to replace {target}: it is a symbolic link ({FORCE_HINT} to replace "
                "the link itself; what it points to is left alone)"
            )
    elif found == "a folder":
        raise OutputError(f"cannot write {what} {target}: it is a folder")
    elif found != "a regular file":
        raise OutputError(
            f"refusing to write {what} {target}: it is {found}, not a regular file; lmckit "
            "replaces only regular files"
        )
    elif not force and not written_by_lmckit(target, kind):
        made = "a result or figure" if kind == "result" else "a weights file"
        raise OutputError(
            f"refusing to replace {target}: it is a file lmckit did not write (not {made} "
            f"of lmckit's); choose a new name or {FORCE_HINT}"
        )


def check_output_file(
    path: str | os.PathLike[str],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    suffixes: Iterable[str] | None = None,
    force: bool = False,
    kind: FileKind = "result",
) -> Path:
    """Validate an output file (``--json``, ``--plot``, a module's weights) before any work.

    Refused: an input, a file inside an input folder or inside any model folder (a
    ``config.json`` beside weights), a suffix outside ``suffixes`` (e.g. the image
    formats a plot can be saved in); at ``path``, a folder, a device, a FIFO or a
    socket. An existing regular file is replaced only if lmckit wrote it as an output
    of ``kind`` (:func:`lmckit.outputs._own_files.written_by_lmckit`) or with ``force``; a
    symbolic link only with ``force`` (the link is replaced, not what it points to).

    Args:
        path: the file to write.
        inputs: paths the command reads; the file may not be or lie inside one.
        suffixes: the file types allowed (``None``: any).
        force: replace an existing regular file or link lmckit did not write (the
            command line's ``--force``, ``overwrite=True`` in Python).
        kind: ``"result"`` (JSON or a figure) or ``"weights"`` (a safetensors file):
            the kind of lmckit's own file that may be replaced without ``force``.

    Raises:
        OutputError: naming the file and the reason.
    """
    what = "output file"
    target, out = named_output(path, inputs, what)
    if suffixes is not None:
        allowed = sorted({s.lower() for s in suffixes})
        if target.suffix.lower() not in allowed:
            raise OutputError(
                f"cannot write {target}: unknown file type {target.suffix or '(none)'!r}; "
                f"use one of {', '.join(allowed)}"
            )
    _check_not_in_model(target, out, what)
    _check_existing_file(target, what, force=force, kind=kind)
    check_writable(out, what)
    return target
