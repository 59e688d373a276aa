"""Where any output may go: never an input, the working or home folder, a special file.

The checks every output of :mod:`lmckit.outputs` shares, folder or file.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "FORCE_HINT",
    "OutputError",
    "check_distinct_outputs",
    "check_protected",
    "check_replaceable",
    "check_writable",
    "entry_kind",
    "inside",
    "named_output",
    "real_path",
]

#: How to ask for a replacement, in every refusal that ``force`` lifts.
FORCE_HINT = "pass --force (overwrite=True in Python)"


class OutputError(ValueError):
    """An output target is refused; the message names it and says why."""


def real_path(path: str | os.PathLike[str]) -> Path:
    """``path`` absolute, every link followed (what an output would really replace)."""
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def inside(child: Path, parent: Path) -> bool:
    """Whether ``child`` is ``parent`` or lies below it (both resolved)."""
    return child == parent or parent in child.parents


def _check_inputs(out: Path, inputs: Iterable[str | os.PathLike[str]], what: str) -> None:
    for raw in inputs:
        inp = real_path(raw)
        if out == inp:
            raise OutputError(f"refusing to write {what} {out}: it is an input of this command")
        if inside(out, inp):
            raise OutputError(f"refusing to write {what} {out}: it lies inside the input {inp}")
        if inside(inp, out):
            raise OutputError(
                f"refusing to write {what} {out}: it contains the input {inp}, which "
                "writing it would destroy"
            )


_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def entry_kind(path: Path) -> str | None:
    """What is at ``path`` itself (a link is not followed), or ``None`` when nothing is."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # (a parent that is a file)
        return None
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def check_replaceable(path: str | os.PathLike[str], *, folder: bool) -> None:
    """Refuse to replace what is at ``path`` unless it is what an atomic write may replace.

    The last check of :mod:`lmckit.outputs._atomic`, right before its rename (the policy's own
    checks ran before any work): a file may replace nothing, a regular file or a
    symbolic link (the link itself, never what it points to); a folder may replace
    nothing, a folder or a symbolic link. A device, a FIFO or a socket is never replaced
    (``os.replace`` would replace ``/dev/null`` itself).

    Raises:
        OutputError: naming the path and what is there.
    """
    target = Path(path)
    kind = entry_kind(target)
    allowed = (None, "a folder" if folder else "a regular file", "a symbolic link")
    if kind not in allowed:
        wanted = "a folder" if folder else "a regular file"
        raise OutputError(f"refusing to replace {target}: it is {kind}, not {wanted}")


def _home() -> Path | None:
    home = os.path.expanduser("~")
    return real_path(home) if home != "~" else None


def check_protected(target: Path, out: Path, what: str) -> None:
    """The working directory, the home folder and their ancestors are never replaced."""
    if inside(real_path(Path.cwd()), out):
        raise OutputError(
            f"refusing to write {what} {target}: it is the current working directory "
            "or one of its parents; name a new folder"
        )
    home = _home()
    if home is not None and inside(home, out):
        raise OutputError(
            f"refusing to write {what} {target}: it is the home folder ({home}) or one of "
            "its parents; name a new folder"
        )


def check_writable(target: Path, what: str) -> None:
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


def named_output(
    path: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]], what: str
) -> tuple[Path, Path]:
    """``path`` as given and resolved, after refusing an empty path or an overlap with
    ``inputs`` (``what`` names the output in errors)."""
    text = os.fspath(path)
    if not text.strip():
        raise OutputError(f"the {what} is an empty path")
    target = Path(text)
    out = real_path(target)
    _check_inputs(out, inputs, what)
    return target, out


def check_distinct_outputs(outputs: Mapping[str, str | os.PathLike[str] | None]) -> None:
    """Two outputs of one command never share a path, nor lie one inside the other.

    Args:
        outputs: each output's name as the user gave it (``"--json"``) and its path;
            ``None`` entries (not asked for) are skipped.

    Raises:
        OutputError: naming both outputs and the path.
    """
    named = [(name, real_path(path)) for name, path in outputs.items() if path is not None]
    for i, (name_a, a) in enumerate(named):
        for name_b, b in named[i + 1 :]:
            if a == b:
                raise OutputError(
                    f"{name_a} and {name_b} both name {a}: one would overwrite the other; "
                    "give each its own path"
                )
            if inside(a, b) or inside(b, a):
                inner, outer = (name_a, name_b) if inside(a, b) else (name_b, name_a)
                raise OutputError(f"{inner} lies inside {outer} ({a}, {b}); give each its own path")
