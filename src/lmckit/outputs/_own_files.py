"""Which existing files lmckit wrote: the files an output may replace without ``--force``.

:mod:`lmckit.outputs` replaces an existing file only when the user asks (``--force``,
``overwrite=True``) or when lmckit recognises it as its own output of the same kind, so
that running a command twice works and a user's file is never lost. Recognised:

* results (``--json``, ``--plot``):
    - a JSON object of the shape of one of lmckit's results: a path (``t``, ``loss``,
      ``barrier_loss``, ``midpoint_loss``, ``meta``), a simplex (``weights``, ``loss``,
      ``barrier_loss``, ``vertex_loss``, ``meta``), a symmetry report (``architecture``,
      ``spaces``, ``elements``, ``moved_elements``, ``left_out``), or an object of paths
      (``lmckit demo``);
    - a figure carrying lmckit's mark (:func:`plot_metadata`): PNG, PDF, SVG, PS and EPS
      (matplotlib cannot mark JPEG, TIFF, WebP or a compressed SVGZ: those need
      ``--force`` to be replaced);
* weights (a module's ``.safetensors`` file, :func:`lmckit.formats.save_model`): a
  safetensors file whose header metadata holds lmckit's ``lmckit`` entry.

Only a regular file is ever recognised (never a link, a folder, a FIFO or a device), and
no more than :data:`MAX_READ_BYTES` of it is read.
"""

from __future__ import annotations

import json
import os
import re
import stat
from importlib import metadata as _metadata
from pathlib import Path
from typing import Literal

__all__ = ["MAX_READ_BYTES", "FileKind", "plot_metadata", "written_by_lmckit"]

#: ``"result"``: a JSON result or a figure; ``"weights"``: a module's weights file.
FileKind = Literal["result", "weights"]
#: The most of a file read to recognise it (a larger JSON is not taken for lmckit's).
MAX_READ_BYTES = 64 << 20
# A figure's mark sits in its first (PNG, SVG, PS) or last (PDF: the Info dictionary)
# bytes; this much of each end is searched.
_MARK_WINDOW = 1 << 16

_RESULT_KEYS = (
    frozenset({"t", "loss", "barrier_loss", "midpoint_loss", "meta"}),  # a path
    frozenset({"weights", "loss", "barrier_loss", "vertex_loss", "meta"}),  # a simplex
    frozenset({"architecture", "spaces", "elements", "moved_elements", "left_out"}),
)
_PATH_KEYS = _RESULT_KEYS[0]
_PNG = b"\x89PNG\r\n\x1a\n"
_SVG_MARK = re.compile(rb"<dc:creator>\s*<cc:Agent>\s*<dc:title>lmckit ")


def _version() -> str:
    try:
        return _metadata.version("lmckit")
    except _metadata.PackageNotFoundError:
        return "unknown"


def plot_metadata(fmt: str) -> dict[str, str] | None:
    """The ``metadata=`` for ``Figure.savefig`` in format ``fmt`` that marks the figure as
    lmckit's (``None``: the format holds no metadata matplotlib can write)."""
    mark = f"lmckit {_version()}"
    if fmt == "png":
        return {"Software": mark}
    if fmt in ("pdf", "svg", "ps", "eps"):
        return {"Creator": mark}
    return None


def _regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is a regular file itself (not a link), else ``None``."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _ends(path: Path, size: int) -> tuple[bytes, bytes]:
    """The first and last :data:`_MARK_WINDOW` bytes of the file."""
    with open(path, "rb") as fh:
        head = fh.read(_MARK_WINDOW)
        fh.seek(max(0, size - _MARK_WINDOW))
        return head, fh.read(_MARK_WINDOW)


def _png_marked(head: bytes) -> bool:
    """A PNG whose ``tEXt`` chunk ``Software`` (before the image data) is lmckit's."""
    at = len(_PNG)
    while at + 8 <= len(head):
        length = int.from_bytes(head[at : at + 4], "big")
        kind = head[at + 4 : at + 8]
        if kind == b"IDAT":
            return False
        if kind == b"tEXt" and head[at + 8 : at + 8 + length].startswith(b"Software\0lmckit "):
            return True
        at += 12 + length
    return False


def _plot_marked(head: bytes, tail: bytes) -> bool:
    if head.startswith(_PNG):
        return _png_marked(head)
    if head.startswith(b"%PDF"):
        return b"/Creator (lmckit " in tail
    if head.startswith(b"%!PS"):
        return b"\n%%Creator: lmckit " in head
    if head.lstrip().startswith(b"<?xml") or head.lstrip().startswith(b"<svg"):
        return _SVG_MARK.search(head) is not None
    return False


def _json_result(path: Path, size: int) -> bool:
    if size > MAX_READ_BYTES:
        return False
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):  # ValueError: not UTF-8 or not JSON
        return False
    if not isinstance(doc, dict):
        return False
    if any(keys <= doc.keys() for keys in _RESULT_KEYS):
        return True
    # lmckit demo: an object of paths
    return bool(doc) and all(isinstance(v, dict) and _PATH_KEYS <= v.keys() for v in doc.values())


def _safetensors_marked(path: Path, size: int) -> bool:
    try:
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if not 2 <= n <= min(size - 8, MAX_READ_BYTES):
                return False
            header = json.loads(fh.read(n))
    except (OSError, ValueError, RecursionError):
        return False
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return isinstance(meta, dict) and "lmckit" in meta


def written_by_lmckit(path: str | os.PathLike[str], kind: FileKind) -> bool:
    """Whether the regular file ``path`` is an output lmckit wrote, of ``kind``.

    Args:
        path: the existing file (a link, a folder, a FIFO or a device is never lmckit's).
        kind: ``"result"`` (a JSON result or a marked figure) or ``"weights"`` (a
            module's safetensors file written by lmckit).
    """
    target = Path(path)
    size = _regular_size(target)
    if size is None:
        return False
    if kind == "weights":
        return _safetensors_marked(target, size)
    try:
        head, tail = _ends(target, size)
    except OSError:
        return False
    if head.lstrip()[:1] == b"{":
        return _json_result(target, size)
    return _plot_marked(head, tail)
