"""Checkpoints: a directory with ``model.safetensors`` and ``config.json``.

:func:`save` writes one atomically; :func:`load` reads it back (or a ``.pt``/``.pth``/
``.bin`` state dict with a ``config.json`` beside it), refusing anything that is not a
plain, finite tensor state dict of the named architecture. Every problem is a
:class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from lmckit._arguments import check_float_dtype
from lmckit._errors import ParameterError
from lmckit.formats._bounded import FileLimitError, read_text
from lmckit.formats._loaded import LoadedModel, check_output_dtype
from lmckit.formats._weightfile import (
    SAFETENSORS_FLOATS,
    CheckpointError,
    check_state_dict,
    load_params_file,
    safetensors_header,
)
from lmckit.models import ModelConfig, ZooModel, build_zoo_model, get_model_class
from lmckit.outputs import OutputKind, check_output_dir
from lmckit.outputs._atomic import atomic_dir, write_json
from lmckit.symmetry._params import as_params, check_finite, first_nonfinite, module_params

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "CheckpointError",
    "CheckpointFormat",
    "held_checkpoint",
    "load",
    "load_metadata",
    "load_params_file",
    "save",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Looked for in this order when ``load`` is given a directory.
_WEIGHT_NAMES = (WEIGHTS_FILE, "model.pt", "model.pth", "model.bin")
# Zoo constructor arguments that repeat a block (a layer count, or a list per layer).
_REPEAT_KWARGS = ("n_layer", "depth", "hidden", "widths")
#: A config.json larger than this is not one lmckit wrote (nor any sane config).
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class CheckpointFormat:
    """The lmckit checkpoint format (:class:`~lmckit.formats._loaded.ModelFormat`): a zoo
    architecture's ``ModelConfig`` and the folder (or weights file) it was read from."""

    config: ModelConfig
    source: Path | None = None
    name: ClassVar[str] = "lmckit"
    output_kind: ClassVar[OutputKind] = "checkpoint"

    def differences(
        self, other: Any, modules: tuple[nn.Module, nn.Module], *, full: bool = True
    ) -> list[str]:
        """The two configs when they differ (a recorded form changes a checkpoint's
        config: compared in the form, so nothing without ``full``)."""
        if not full or other.config == self.config:
            return []
        return [f"{self.config} vs {other.config}"]

    def save(
        self,
        path: str | os.PathLike[str],
        model: Any,
        params: Mapping[str, Tensor],
        *,
        metadata: Mapping[str, Any] | None,
        overwrite: bool,
        dtype: torch.dtype | None = None,
        sources: Any = (),
        module: ZooModel | None = None,
        config_changes: Mapping[str, Any] | None = None,
    ) -> Path:
        """:func:`save` of ``params`` (``module``: another zoo architecture to write)."""
        if config_changes is not None:
            raise ParameterError("{config_changes}= is for Hugging Face folders; pass {module}=",
                                 config_changes="config_changes", module="module")  # fmt: skip
        check_output_dtype(dtype, self.output_kind)
        check_output_dir(path, kind="checkpoint", inputs=model.inputs, force=overwrite)
        arch = module if module is not None else self.config
        return save(path, arch, params, metadata=metadata, overwrite=overwrite)

    def describe(self, module: nn.Module) -> str:
        return f"an lmckit model ({type(module).__name__})"


def held_checkpoint(module: ZooModel) -> LoadedModel:
    """A zoo model held in memory, written as an lmckit checkpoint."""
    params = module_params(module)
    return LoadedModel(module, params, CheckpointFormat(module.config), None)


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
                        return build_zoo_model(config)
                except (RuntimeError, NotImplementedError):
                    pass  # an __init__ that computes on tensors: build it for real
            return build_zoo_model(config)
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


def _check_repeats(config: ModelConfig, tensors: int, where: Path) -> None:
    """Layer counts of a config against the tensors stored, before anything is built.

    Every layer holds at least one tensor, so a config that repeats a block more often
    than the file has tensors is wrong; checking first keeps a corrupt config (a
    thousand billion layers) from spending forever building even a shapes-only module.
    """
    for key in _REPEAT_KWARGS:
        value = config.kwargs.get(key)
        count = len(value) if isinstance(value, list | tuple) else value
        if isinstance(count, int) and not isinstance(count, bool) and count > tensors:
            shown = f"{count} entries" if isinstance(value, list | tuple) else f"{count}"
            raise CheckpointError(
                f"{where}: {key} is {shown}, but the weights file holds only {tensors} tensors"
            )


def _check_header(
    header: Mapping[str, tuple[str, tuple[int, ...]]], module: ZooModel, where: Path
) -> None:
    """The weights' names, shapes and kinds of dtype against the module's, before loading."""
    state = module.state_dict()
    _check_shapes({k: shape for k, (_, shape) in header.items()}, module, where)
    for key, (dtype, _shape) in header.items():
        stored_float = dtype in SAFETENSORS_FLOATS
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


def load(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = torch.float32,
    check_values: bool = True,
) -> LoadedModel:
    """Read a checkpoint directory, or a weights file with ``config.json`` beside it
    (the checkpoint format's reader: :func:`lmckit.load` reads every format).

    Nothing large is allocated before the weights are known to fit the config: the
    module is first built on the meta device (shapes only) and a safetensors file's
    header (names, shapes, dtypes) is checked against it. Then the weights are read,
    checked again, and loaded into the real module (eval mode).

    Args:
        path: a checkpoint folder or a weights file.
        dtype: floating-point weights are converted to this dtype (float16, bfloat16,
            float64 checkpoints all compute in float32 by default); ``None`` keeps them
            as stored. Integer buffers (e.g. BatchNorm's ``num_batches_tracked``) stay
            integers; integer or boolean weights are refused, naming the parameter, and so
            is a weight whose values overflow ``dtype`` (a float64 1e300 in float32).
        check_values: refuse NaN and infinite values and overflows of ``dtype``;
            ``False`` for a caller that checks what it reads itself.

    Raises:
        CheckpointError: naming the file and the first problem found.
    """
    check_float_dtype(dtype)
    weights_path, config_path = _locate(Path(path))
    config = _read_config(config_path)
    header, params = None, None
    if weights_path.suffix.lower() == ".safetensors":
        header = safetensors_header(weights_path)  # reads the header only
        _check_repeats(config, len(header), config_path)
    else:
        # a pickle has no header: bounded by its size
        params = load_params_file(weights_path, require_finite=check_values)
        _check_repeats(config, len(params), config_path)
    shapes = _build(config, config_path, meta=True)
    if header is not None:
        _check_header(header, shapes, weights_path)
    if params is None:
        params = load_params_file(weights_path, require_finite=check_values)
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
    # the stored values are finite (checked on reading): only the conversion can overflow
    overflow = first_nonfinite(params) if check_values else None
    if overflow is not None:
        raise CheckpointError(
            f"{weights_path}: parameter {overflow!r} overflows {dtype} (its values lie beyond "
            "that dtype's range); load it with dtype=None to keep the stored dtype"
        )
    module.load_state_dict(params, strict=True)
    module.eval()
    return LoadedModel(module, params, CheckpointFormat(config, Path(path)), Path(path))


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
    overwrite: bool = False,
) -> Path:
    """Write ``params`` of the architecture ``model_or_config`` as a checkpoint directory.

    The directory gets ``model.safetensors`` and ``config.json`` (architecture, kwargs,
    lmckit version and ``metadata`` if given). It appears all at once; on any error
    nothing at ``path`` changes. ``path`` follows lmckit's output policy
    (:func:`lmckit.outputs.check_output_dir`): a new or empty folder, or a checkpoint
    lmckit wrote (replaced); never the working directory or one of its parents.

    Args:
        path: the checkpoint folder to write.
        model_or_config: a zoo model (its ``config``) or a ``ModelConfig``.
        params: the weights, keys and shapes of that architecture, finite.
        metadata: JSON-able record of what produced the weights (``config.json``'s
            ``metadata``).
        overwrite: also replace a non-empty folder lmckit did not write (the command
            line's ``--force``); never the working directory or its parents.

    Raises:
        OutputError: ``path`` may not be written (the message says why).
        TypeError: ``params`` is not a state dict (a checkpoint: pass its ``.params``).
        CheckpointError: non-finite values, keys/shapes that do not fit the
            architecture, or a config/metadata that is not JSON-serialisable.
    """
    target = check_output_dir(path, kind="checkpoint", force=overwrite)
    as_params(params)
    if isinstance(model_or_config, ModelConfig):
        config = model_or_config
    else:
        found = getattr(model_or_config, "config", None)
        if not isinstance(found, ModelConfig):
            raise CheckpointError(
                f"cannot save {target}: the model has no ModelConfig (build it with "
                "lmckit.models.create_model, or pass a ModelConfig)"
            )
        config = found
    state = check_state_dict(dict(params), target)
    try:
        check_finite(state, what=f"refusing to save {target}")
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    # Check against the architecture now: a checkpoint that load() rejects is useless
    # (names, shapes, and floating-point weights where the model computes in them).
    shapes = _build(config, target, meta=True)
    _check_layout(state, shapes, target)
    expected = shapes.state_dict()
    for key, value in state.items():
        _check_kind(key, value.dtype, value.is_floating_point(), expected[key], target)

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
