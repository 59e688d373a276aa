"""Bounded reads of user files: regular files only, size caps, limited decompression.

A path given by a user may name a FIFO (reading it blocks forever), a device such as
``/dev/zero`` (endless), a huge file, or a small gzip that expands to gigabytes. Every
config, weights and data file lmckit reads goes through these functions, which check
the kind of file first and never read more than a stated number of bytes.
"""

from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path

__all__ = ["FileLimitError", "read_bytes", "read_maybe_gzip", "read_text", "regular_file"]

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


class FileLimitError(ValueError):
    """A file is missing, unreadable, not a regular file, or larger than allowed."""


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def regular_file(path: str | os.PathLike[str], *, what: str = "file") -> Path:
    """``path`` if it is (a link to) a regular file; else a :class:`FileLimitError`.

    Raises:
        FileNotFoundError: nothing at ``path``.
        FileLimitError: a folder, FIFO, socket or device, or an unreadable path.
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode  # follows symbolic links
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p} does not exist") from None
    except OSError as err:
        raise FileLimitError(f"cannot read {what} {p}: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        kind = (
            "a folder"
            if stat.S_ISDIR(mode)
            else "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )
        raise FileLimitError(f"{what} {p} is {kind}; expected a regular file")
    return p


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (checked before and while reading)."""
    p = regular_file(path, what=what)
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > max_bytes:
                raise FileLimitError(
                    f"{what} {p} is {_size(size)}, more than the {_size(max_bytes)} allowed"
                )
            # read one byte more than allowed: a file that grows while read is caught too
            data = fh.read(max_bytes + 1)
    except OSError as err:
        raise FileLimitError(f"cannot read {what} {p}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise FileLimitError(f"{what} {p} holds more than the {_size(max_bytes)} allowed")
    return data


def read_text(path: str | os.PathLike[str], *, max_bytes: int, what: str = "file") -> str:
    """A UTF-8 text file of at most ``max_bytes``."""
    data = read_bytes(path, max_bytes=max_bytes, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileLimitError(f"{what} {path} is not UTF-8 text ({err.reason})") from None


def read_maybe_gzip(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    max_output: int,
    what: str = "file",
) -> bytes:
    """A file's bytes, gunzipped when it starts with the gzip magic, both sizes bounded.

    Decompression is streamed and stops as soon as the output would exceed
    ``max_output``, so a small file that expands to gigabytes costs nothing.

    Raises:
        FileLimitError: not a regular file, too large, or expanding past ``max_output``.
        ValueError: a corrupt or truncated gzip stream.
    """
    raw = read_bytes(path, max_bytes=max_bytes, what=what)
    if raw[:2] != _GZIP_MAGIC:
        if len(raw) > max_output:
            raise FileLimitError(f"{what} {path} holds more than the {_size(max_output)} allowed")
        return raw
    out = bytearray()
    # wbits=31: the gzip container; concatenated members are handled by the loop
    decomp = zlib.decompressobj(wbits=31)
    data = raw
    try:
        while data:
            chunk = decomp.decompress(data, max_output + 1 - len(out))
            out += chunk
            if len(out) > max_output:
                raise FileLimitError(
                    f"{what} {path} expands to more than the {_size(max_output)} allowed"
                )
            if decomp.unconsumed_tail:
                data = decomp.unconsumed_tail
                continue
            if decomp.eof and decomp.unused_data:
                data = decomp.unused_data  # another gzip member follows
                decomp = zlib.decompressobj(wbits=31)
                continue
            break
        if not decomp.eof:
            raise ValueError(f"{path}: corrupt or truncated gzip stream (ends early)")
    except zlib.error as err:
        raise ValueError(f"{path}: corrupt or truncated gzip stream ({err})") from None
    return bytes(out)
