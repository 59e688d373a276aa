"""Checkpoints: a directory with ``model.safetensors`` and ``config.json``.

:func:`save` writes one atomically; :func:`load` reads it back (or a ``.pt``/``.pth``/
``.bin`` state dict with a ``config.json`` beside it), refusing anything that is not a
plain, finite tensor state dict of the named architecture. Every problem is a
:class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import warnings
from collections.abc import Mapping
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from lmckit.atomic import atomic_dir, write_json
from lmckit.bounded import FileLimitError, read_text, regular_file
from lmckit.models import ModelConfig, ZooModel, build_module, get_model_class
from lmckit.params import Params, check_finite

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "Checkpoint",
    "CheckpointError",
    "load",
    "load_metadata",
    "load_params_file",
    "save",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Looked for in this order when ``load`` is given a directory.
_WEIGHT_NAMES = (WEIGHTS_FILE, "model.pt", "model.pth", "model.bin")
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin")
#: A config.json larger than this is not one lmckit wrote (nor any sane config).
MAX_CONFIG_BYTES = 1 << 20
_MAX_HEADER_BYTES = 100 << 20
_SAFETENSORS_FLOATS = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read; the message names the file and the problem."""


class Checkpoint(NamedTuple):
    """A loaded checkpoint: the rebuilt module (eval mode, weights loaded), its weights, config."""

    model: ZooModel
    params: Params
    config: ModelConfig


def _version() -> str:
    try:
        return _metadata.version("lmckit")
    except _metadata.PackageNotFoundError:
        return "unknown"


def _build(config: ModelConfig, where: Path, *, meta: bool = False) -> ZooModel:
    """Construct the module of ``config``; configuration errors name ``where``.

    ``meta=True`` builds on the meta device (shapes only, no memory, no init cost).
    The global RNG is left as it was either way.
    """
    try:
        get_model_class(config.name)
    except KeyError as err:
        raise CheckpointError(f"{where}: {err.args[0]}") from None
    try:
        with torch.random.fork_rng(devices=[]):
            if meta:
                try:
                    with torch.device("meta"):
                        return build_module(config)
                except (RuntimeError, NotImplementedError):
                    pass  # an __init__ that computes on tensors: build it for real
            return build_module(config)
    except (ValueError, TypeError, RuntimeError, OverflowError, MemoryError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{where}: cannot build {config.name}: {reason}") from None


def _check_layout(params: Mapping[str, Tensor], module: ZooModel, where: Path) -> None:
    """Keys and shapes of ``params`` must equal those of ``module.state_dict()``."""
    _check_shapes({k: tuple(v.shape) for k, v in params.items()}, module, where)


def _check_shapes(shapes: Mapping[str, tuple[int, ...]], module: ZooModel, where: Path) -> None:
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    name = module.config.name
    for key in expected:
        if key not in shapes:
            raise CheckpointError(f"{where}: parameter {key!r} of {name!r} is missing")
    for key in shapes:
        if key not in expected:
            raise CheckpointError(f"{where}: unexpected parameter {key!r} (not in {name!r})")
    for key, shape in expected.items():
        got = tuple(shapes[key])
        if got != shape:
            raise CheckpointError(
                f"{where}: parameter {key!r} has shape {got} but {name!r} expects {shape}"
            )


def _check_state_dict(obj: object, where: Path) -> Params:
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
        # Reading a byte first separates "cannot read" from "corrupt" below.
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
    params = _check_state_dict(obj, p)
    if require_finite:
        try:
            check_finite(params, what=str(p))
        except ValueError as err:
            raise CheckpointError(str(err)) from None
    return params


def _locate(path: Path) -> tuple[Path, Path]:
    """``(weights file, config.json)`` of a checkpoint directory or weights file."""
    if path.is_dir():
        for name in _WEIGHT_NAMES:
            if (path / name).is_file():
                return path / name, path / CONFIG_FILE
        raise CheckpointError(
            f"{path} holds no weights file (expected one of {', '.join(_WEIGHT_NAMES)})"
        )
    if path.exists():
        return path, path.parent / CONFIG_FILE
    raise CheckpointError(f"{path} does not exist")


def _read_config_json(config_path: Path) -> dict[str, Any]:
    try:
        text = read_text(config_path, max_bytes=MAX_CONFIG_BYTES, what="config")
    except FileNotFoundError:
        raise CheckpointError(
            f"{config_path} is missing: a checkpoint needs {CONFIG_FILE} beside its weights"
        ) from None
    except FileLimitError as err:
        raise CheckpointError(str(err)) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise CheckpointError(f"{config_path} is nested too deeply to be a config") from None
    except ValueError as err:  # JSONDecodeError, or an integer of thousands of digits
        raise CheckpointError(f"{config_path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{config_path} must hold a JSON object")
    return data


def _read_config(config_path: Path) -> ModelConfig:
    data = _read_config_json(config_path)
    try:
        return ModelConfig.from_json(data)
    except ValueError as err:
        raise CheckpointError(f"{config_path}: {err}") from None


def _safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` from a safetensors header, reading nothing else.

    The format: an unsigned little-endian 64-bit header length, then that many bytes
    of JSON mapping each tensor's name to its dtype, shape and byte offsets.
    """
    try:
        size = regular_file(path, what="weights file").stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > min(size - 8, _MAX_HEADER_BYTES):
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


def _check_header(
    header: Mapping[str, tuple[str, tuple[int, ...]]], module: ZooModel, where: Path
) -> None:
    """The weights' names, shapes and kinds of dtype against the module's, before loading."""
    state = module.state_dict()
    _check_shapes({k: shape for k, (_, shape) in header.items()}, module, where)
    for key, (dtype, _shape) in header.items():
        stored_float = dtype in _SAFETENSORS_FLOATS
        _check_kind(key, dtype, stored_float, state[key], where)


def _check_kind(key: str, dtype: object, stored_float: bool, expected: Tensor, where: Path) -> None:
    wants_float = expected.is_floating_point()
    if wants_float and not stored_float:
        raise CheckpointError(
            f"{where}: parameter {key!r} is stored as {dtype}, not floating point; lmckit "
            "needs floating-point weights (float32, float16, bfloat16 or float64)"
        )
    if stored_float and not wants_float:
        raise CheckpointError(
            f"{where}: {key!r} is stored as {dtype} but the model keeps it as {expected.dtype}"
        )


def load(path: str | os.PathLike[str], *, dtype: torch.dtype | None = torch.float32) -> Checkpoint:
    """Load a checkpoint directory, or a weights file with ``config.json`` beside it.

    Nothing large is allocated before the weights are known to fit the config: the
    module is first built on the meta device (shapes only) and a safetensors file's
    header (names, shapes, dtypes) is checked against it. Then the weights are read,
    checked again, and loaded into the real module (eval mode).

    Args:
        path: a checkpoint folder or a weights file.
        dtype: floating-point weights are converted to this dtype (float16, bfloat16,
            float64 checkpoints all compute in float32 by default); ``None`` keeps them
            as stored. Integer buffers (e.g. BatchNorm's ``num_batches_tracked``) stay
            integers; integer or boolean weights are refused, naming the parameter.

    Raises:
        CheckpointError: naming the file and the first problem found.
    """
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype or None, got {dtype}")
    weights_path, config_path = _locate(Path(path))
    config = _read_config(config_path)
    shapes = _build(config, config_path, meta=True)
    if weights_path.suffix.lower() == ".safetensors":
        _check_header(_safetensors_header(weights_path), shapes, weights_path)
    params = load_params_file(weights_path)
    _check_layout(params, shapes, weights_path)
    expected = shapes.state_dict()
    for key, value in params.items():
        _check_kind(key, value.dtype, value.is_floating_point(), expected[key], weights_path)
    module = _build(config, config_path)
    # safetensors stores keys sorted; give them back in the module's own order.
    params = {
        k: params[k].to(dtype) if dtype is not None and params[k].is_floating_point() else params[k]
        for k in module.state_dict()
    }
    module.load_state_dict(params, strict=True)
    module.eval()
    return Checkpoint(module, params, config)


def load_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``metadata`` given to :func:`save` for a checkpoint (``{}`` when none)."""
    _weights, config_path = _locate(Path(path))
    meta = _read_config_json(config_path).get("metadata", {})
    if not isinstance(meta, dict):
        raise CheckpointError(f"{config_path}: 'metadata' must be a JSON object")
    return meta


def save(
    path: str | os.PathLike[str],
    model_or_config: ZooModel | ModelConfig,
    params: Mapping[str, Tensor],
    *,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``params`` of the architecture ``model_or_config`` as a checkpoint directory.

    The directory gets ``model.safetensors`` and ``config.json`` (architecture, kwargs,
    lmckit version and ``metadata`` if given). It appears all at once, replacing any
    earlier one at ``path``; on any error nothing at ``path`` changes.

    Raises:
        CheckpointError: non-finite values, keys/shapes that do not fit the
            architecture, or a config/metadata that is not JSON-serialisable.
    """
    target = Path(path)
    if isinstance(model_or_config, ModelConfig):
        config = model_or_config
    else:
        config = getattr(model_or_config, "config", None)
        if not isinstance(config, ModelConfig):
            raise CheckpointError(
                f"cannot save {target}: the model has no ModelConfig (build it with "
                "lmckit.models.create_model, or pass a ModelConfig)"
            )
    state = _check_state_dict(dict(params), target)
    try:
        check_finite(state, what=f"refusing to save {target}")
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    # Check against the architecture now: a checkpoint that load() rejects is useless.
    _check_layout(state, _build(config, target, meta=True), target)

    doc: dict[str, Any] = {**config.to_json(), "lmckit_version": _version()}
    if metadata is not None:
        doc["metadata"] = dict(metadata)
    try:
        # Fail on non-JSON config/metadata before anything touches the disk.
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"cannot save {target}: config or metadata is not JSON: {err}"
        ) from None

    # safetensors wants contiguous CPU tensors and rejects ones that share memory
    # (tied weights, views); a contiguous clone of each satisfies both.
    tensors = {
        k: v.detach().to("cpu").clone(memory_format=torch.contiguous_format)
        for k, v in state.items()
    }
    with atomic_dir(target) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        write_json(tmp / CONFIG_FILE, doc)
        # safetensors creates its file 0600; give it the config's (umask) permissions
        os.chmod(tmp / WEIGHTS_FILE, (tmp / CONFIG_FILE).stat().st_mode & 0o777)
    return target
