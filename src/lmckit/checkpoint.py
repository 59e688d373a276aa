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
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{where}: cannot build {config}: {err}") from None


def _check_layout(params: Mapping[str, Tensor], module: ZooModel, where: Path) -> None:
    """Keys and shapes of ``params`` must equal those of ``module.state_dict()``."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    name = module.config.name
    for key in expected:
        if key not in params:
            raise CheckpointError(f"{where}: parameter {key!r} of {name!r} is missing")
    for key in params:
        if key not in expected:
            raise CheckpointError(f"{where}: unexpected parameter {key!r} (not in {name!r})")
    for key, shape in expected.items():
        got = tuple(params[key].shape)
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
        # Reading a byte first separates "cannot read" from "corrupt" below.
        with open(p, "rb") as fh:
            fh.read(1)
    except FileNotFoundError:
        raise CheckpointError(f"{p} does not exist") from None
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
        text = config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(
            f"{config_path} is missing: a checkpoint needs {CONFIG_FILE} beside its weights"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"cannot read {config_path}: {err}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
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


def load(path: str | os.PathLike[str]) -> Checkpoint:
    """Load a checkpoint directory, or a weights file with ``config.json`` beside it.

    The module is rebuilt from the config, the file's keys and shapes must match its
    state dict exactly, and the weights are loaded into it (eval mode). ``params`` are
    the tensors as stored (dtypes included), in the module's state-dict order.

    Raises:
        CheckpointError: naming the file and the first problem found.
    """
    weights_path, config_path = _locate(Path(path))
    config = _read_config(config_path)
    module = _build(config, config_path)
    params = load_params_file(weights_path)
    _check_layout(params, module, weights_path)
    # safetensors stores keys sorted; give them back in the module's own order.
    params = {k: params[k] for k in module.state_dict()}
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
    return target
