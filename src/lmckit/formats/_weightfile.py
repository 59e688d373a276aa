"""Reading weights files safely: safetensors (header first) and weights-only pickles.

:func:`load_params_file` returns the plain tensor state dict of a ``.safetensors`` or
``.pt``/``.pth``/``.bin`` file, refusing anything else (a pickle that would run code, a
nested container, non-finite values); :func:`safetensors_header` reads only a
safetensors file's header (names, dtypes, shapes), so a file can be checked against an
architecture before its tensors are read. Every problem is a :class:`CheckpointError`
naming the file.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from lmckit.formats._bounded import FileLimitError, regular_file
from lmckit.formats._read_once import ReadOnce
from lmckit.symmetry._params import Params, check_finite

__all__ = [
    "SAFETENSORS_FLOATS",
    "CheckpointError",
    "check_state_dict",
    "load_params_file",
    "safetensors_header",
]

_PICKLE_SUFFIXES = (".pt", ".pth", ".bin")
_MAX_HEADER_BYTES = 100 << 20
#: safetensors dtype names of floating-point tensors.
SAFETENSORS_FLOATS = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read; the message names the file and the problem."""


def check_state_dict(obj: object, where: Path) -> Params:
    """``obj`` as a ``dict[str, Tensor]``, or a :class:`CheckpointError` saying why not."""
    if not isinstance(obj, dict):
        raise CheckpointError(
            f"{where} does not hold a state dict (a dict of tensors) but a {type(obj).__name__}"
        )
    out: Params = {}
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            hint = ""
            if isinstance(value, Mapping):
                hint = f" (a nested dict: save its {key!r} entry on its own)"
            raise CheckpointError(
                f"{where} is not a plain state dict: entry {key!r} is a "
                f"{type(value).__name__}, not a tensor{hint}"
            )
        # detach(): a saved nn.Parameter comes back as a plain tensor.
        out[key] = value.detach()
    return out


def _pickle_truncated(path: Path) -> bool:
    """Whether the leading pickles of a non-zip ``.pt`` file end early.

    The weights-only unpickler reports a truncated legacy file as an "unsupported
    global" (it sees a cut-off name), the same error as a malicious file. Parsing the
    opcodes with :mod:`pickletools` (which executes nothing) tells the two apart. The
    legacy format is five pickles followed by raw storage bytes, so only five are read.
    """
    with open(path, "rb") as fh:
        for _ in range(5):
            if not fh.read(1):
                return False
            fh.seek(-1, os.SEEK_CUR)
            try:
                for _op in pickletools.genops(fh):
                    pass
            except Exception:
                return True
    return False


def _load_pickle(path: Path) -> object:
    with open(path, "rb") as fh:
        is_zip = fh.read(4) == b"PK\x03\x04"
    try:
        with warnings.catch_warnings():
            # Raised for any protocol other than 2; irrelevant when the load is weights-only.
            warnings.filterwarnings(
                "ignore", message="Detected pickle protocol", category=UserWarning
            )
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # Keep the unpickler's own reason (e.g. the blocked global), without its boilerplate.
        lines = str(err).splitlines()
        reason = next((ln.strip() for ln in lines if "nsupported" in ln), lines[0] if lines else "")
        if not is_zip and _pickle_truncated(path):
            raise CheckpointError(f"{path} is corrupt or truncated: {reason}") from None
        raise CheckpointError(
            f"refusing to load {path}: it is not a plain tensor state dict (unsafe pickle: "
            f"{reason})"
        ) from None
    except Exception as err:
        raise CheckpointError(
            f"{path} is corrupt or truncated: {type(err).__name__}: {err}"
        ) from None


def load_params_file(path: str | os.PathLike[str], *, require_finite: bool = True) -> Params:
    """The tensors of a ``.safetensors`` or ``.pt``/``.pth``/``.bin`` file, on the CPU.

    Pickle files are read weights-only: anything but tensors and plain containers (for
    instance a pickle that would run code) is refused. The result must be a flat
    ``dict[str, Tensor]``; with ``require_finite`` NaN/inf values are refused too.

    Raises:
        CheckpointError: missing, unreadable, corrupt, truncated, unsafe or non-finite.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix != ".safetensors" and suffix not in _PICKLE_SUFFIXES:
        raise CheckpointError(
            f"{p}: unknown weights format {p.suffix!r}; expected .safetensors, .pt, .pth or .bin"
        )
    try:
        regular_file(p, what="weights file")
        if suffix == ".safetensors":
            # the header (read once per process) separates "cannot read" and a bad
            # header from a corrupt body below
            safetensors_header(p)
        else:
            # reading a byte first separates "cannot read" from "corrupt" below
            with open(p, "rb") as fh:
                fh.read(1)
    except FileNotFoundError:
        raise CheckpointError(f"{p} does not exist") from None
    except FileLimitError as err:
        raise CheckpointError(str(err)) from None
    except OSError as err:
        raise CheckpointError(f"cannot read {p}: {err}") from None
    if suffix == ".safetensors":
        try:
            obj: object = load_file(p, device="cpu")
        except Exception as err:
            raise CheckpointError(f"{p} is corrupt or truncated: {err}") from None
    else:
        obj = _load_pickle(p)
    params = check_state_dict(obj, p)
    if require_finite:
        try:
            check_finite(params, what=str(p))
        except ValueError as err:
            raise CheckpointError(str(err)) from None
    return params


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` from a safetensors header, reading nothing else (once
    per process while the file is unchanged, :mod:`lmckit.formats._read_once`).

    The format: an unsigned little-endian 64-bit header length, then that many bytes
    of JSON mapping each tensor's name to its dtype, shape and byte offsets.
    """
    return _HEADERS(path, _MAX_HEADER_BYTES)


def _read_header(path: Path, max_bytes: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    try:
        size = regular_file(path, what="weights file").stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > min(size - 8, max_bytes):
                raise CheckpointError(f"{path} is corrupt or truncated: bad header length")
            header = json.loads(fh.read(n))
    except FileLimitError as err:
        raise CheckpointError(str(err)) from None
    except (ValueError, RecursionError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is corrupt or truncated: bad header ({err})") from None
    except OSError as err:
        raise CheckpointError(f"cannot read {path}: {err}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is corrupt or truncated: bad header")
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("dtype"), str)
            and isinstance(entry.get("shape"), list)
            and all(isinstance(d, int) and d >= 0 for d in entry["shape"])
        ):
            raise CheckpointError(f"{path} is corrupt or truncated: bad entry {name!r}")
        out[name] = (entry["dtype"], tuple(entry["shape"]))
    return out


#: Each file's header read once.
_HEADERS = ReadOnce(_read_header)
