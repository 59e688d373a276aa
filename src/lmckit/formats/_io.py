"""Models in and out, in any format: :func:`load` reads them, :func:`save_model` writes.

:func:`load` is the one loader: an lmckit checkpoint (a folder, or a weights file with
its ``config.json``), a Hugging Face folder, or a ``.safetensors`` / ``.pt`` file of
parameters (given the module they belong to, ``like=``) all become one
:class:`~lmckit.formats.LoadedModel`; :func:`held_model` wraps a module the caller holds
in the same type. What differs between formats is the model's
:class:`~lmckit.formats._loaded.ModelFormat`, which writes a result back in its format
(:func:`save_model`) and says what makes two models different architectures
(:func:`check_same_architecture`): no caller branches on where a model came from.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from lmckit._arguments import check_float_dtype
from lmckit._errors import ParameterError, literal
from lmckit.formats._checkpoint import (
    CONFIG_FILE,
    CheckpointError,
    CheckpointFormat,
    held_checkpoint,
)
from lmckit.formats._checkpoint import load as read_checkpoint
from lmckit.formats._loaded import LoadedModel, ModelFormat, check_output_dtype
from lmckit.formats._weightfile import check_state_dict, load_params_file
from lmckit.hf._files import MAX_CONFIG_BYTES, HFError, is_hf_folder, read_json_file
from lmckit.hf._model import HFFormat, held_hf, load_hf
from lmckit.models import ZooModel
from lmckit.outputs import OutputKind, check_output_file
from lmckit.outputs._atomic import atomic_path
from lmckit.symmetry._params import (
    IncompatibleModelsError,
    as_module,
    as_params,
    check_compatible,
    check_finite,
    module_params,
)

__all__ = [
    "MODULE_FILE_SUFFIX",
    "LoadedModel",
    "ModelFormat",
    "ModuleFormat",
    "check_same_architecture",
    "check_same_config",
    "held_model",
    "load",
    "load_model",
    "model_format",
    "output_kind_of",
    "save_model",
]

#: Suffix of the file a ``"module"``-format model is written to.
MODULE_FILE_SUFFIX = ".safetensors"
#: What :func:`model_format` finds at a path.
StoredFormat = Literal["lmckit", "hf"]


@dataclass(frozen=True)
class ModuleFormat:
    """Any other module's format (:class:`~lmckit.formats._loaded.ModelFormat`): its parameters as
    one safetensors file (``module.load_state_dict(load_file(path))`` restores them).

    Attributes:
        source: the parameters file it was read from (``None``: held in memory).
    """

    source: Path | None = None
    name: ClassVar[str] = "module"
    output_kind: ClassVar[OutputKind] = "checkpoint"
    config: ClassVar[Any] = None

    def differences(
        self, other: Any, modules: tuple[nn.Module, nn.Module], *, full: bool = True
    ) -> list[str]:
        a, b = (type(m).__name__ for m in modules)
        return [f"a {a} and a {b}"] if type(modules[0]) is not type(modules[1]) else []

    def save(
        self,
        path: str | os.PathLike[str],
        model: LoadedModel,
        params: Mapping[str, Tensor],
        *,
        metadata: Mapping[str, Any] | None,
        overwrite: bool,
        dtype: torch.dtype | None = None,
        sources: Sequence[str | os.PathLike[str]] = (),
        module: Any = None,
        config_changes: Mapping[str, Any] | None = None,
    ) -> Path:
        """``params`` as one safetensors file (tied weights once, under their first
        name); an existing file is replaced if lmckit wrote it, or with ``overwrite``."""
        check_output_dtype(dtype, self.output_kind)
        if module is not None or config_changes is not None:
            raise ParameterError("{module}= and {config_changes}= are for checkpoints and folders",
                                 module="module", config_changes="config_changes")  # fmt: skip
        target = check_output_file(path, inputs=model.inputs, suffixes=[MODULE_FILE_SUFFIX],
                                   force=overwrite, kind="weights")  # fmt: skip
        state = check_state_dict(dict(params), target)
        check_compatible(model.params, state)
        try:
            check_finite(state, what=f"refusing to write {target}")
        except ValueError as err:
            raise CheckpointError(str(err)) from None
        meta = {"lmckit": json.dumps(dict(metadata or {}), allow_nan=False)}
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
        with atomic_path(target) as tmp:
            save_file(tensors, str(tmp), metadata={"format": "pt", **meta})
        return target

    def describe(self, module: nn.Module) -> str:
        return f"a module ({type(module).__name__})"


def model_format(path: str | os.PathLike[str]) -> StoredFormat:
    """``"hf"`` for a folder with a Hugging Face ``config.json``, else ``"lmckit"`` (reads
    the config once per process: loading the model reads it from memory).

    Raises:
        CheckpointError: a folder whose ``config.json`` is neither format's.
    """
    if is_hf_folder(path):
        return "hf"
    config = Path(path) / CONFIG_FILE
    if Path(path).is_dir() and config.is_file():
        try:
            data = read_json_file(config, max_bytes=MAX_CONFIG_BYTES, what="config")
        except HFError:
            return "lmckit"  # checkpoint.load reports the problem in its own words
        if isinstance(data, dict) and "architecture" not in data:
            raise CheckpointError(
                f"{config} is neither an lmckit checkpoint's config (no 'architecture') "
                "nor a Hugging Face config (no 'model_type')"
            )
    return "lmckit"


#: Each stored format's reader's format class (what a path holds, before it is read).
_FORMATS: dict[str, Any] = {"hf": HFFormat, "lmckit": CheckpointFormat}


def output_kind_of(path: str | os.PathLike[str]) -> OutputKind:
    """The output policy's kind of a model written like the one at ``path`` (its config
    read once per process: loading it reads it from memory)."""
    kind: OutputKind = _FORMATS[model_format(path)].output_kind
    return kind


def _parameters_file(path: Path) -> bool:
    """A weights file with no ``config.json`` beside it: parameters without a module."""
    return path.is_file() and not (path.parent / CONFIG_FILE).is_file()


def load(
    path: str | os.PathLike[str],
    *,
    like: LoadedModel | nn.Module | None = None,
    dtype: torch.dtype | None = torch.float32,
    check_values: bool = True,
) -> LoadedModel:
    """Load a model in any format: the one loader.

    Args:
        path: an lmckit checkpoint (folder, or weights file with its ``config.json``), a
            Hugging Face folder, or a ``.safetensors`` / ``.pt`` / ``.pth`` / ``.bin`` file
            of parameters alone (``like=`` gives their module).
        like: a model the one at ``path`` must be an architecture of: a
            :class:`~lmckit.formats.LoadedModel` (checked as
            :func:`check_same_architecture`; a mismatch names both), or the module a
            parameters file belongs to (a copy of it holds them).
        dtype: floating dtype of the weights; ``None`` keeps them as stored.
        check_values: refuse NaN and infinite values on loading, which reads every
            value. ``False``: not checked here, for a caller that checks what it reads
            (weight matching does); a Hugging Face folder's safetensors loaded with
            ``dtype=None`` then stay memory-mapped, unread until a weight is used, so
            processes that each align their share of a model read only that share.

    Raises:
        CheckpointError: (or its subclass :class:`~lmckit.hf.HFError`) naming the file
            and the problem.
        IncompatibleModelsError: a model that is not ``like``'s architecture.
        ParameterError: a parameters file without ``like``.
        TypeError, ValueError: a ``dtype`` that is not a floating-point ``torch.dtype``.
    """
    check_float_dtype(dtype)
    where = Path(path)
    if _parameters_file(where) and like is not None:
        return _load_parameters(where, like, dtype=dtype, check_values=check_values)
    if model_format(where) == "hf":
        model = load_hf(where, dtype=dtype, check_values=check_values)
    else:
        try:
            model = read_checkpoint(where, dtype=dtype, check_values=check_values)
        except CheckpointError as err:
            if _parameters_file(where) and like is None:
                why = literal(err)
                raise ParameterError(f"{why}: give the module these parameters belong to, "
                                     "{like}", like="like") from None  # fmt: skip
            raise
    if isinstance(like, LoadedModel):
        try:
            check_same_architecture(like, model)
        except IncompatibleModelsError as err:
            raise IncompatibleModelsError(
                f"{_name(like)} and {where} are different architectures: {err}"
            ) from None
    return model


#: The name this loader had (kept: tests, scripts and docs call it).
load_model = load


def _name(model: LoadedModel) -> str:
    return str(model.path) if model.path is not None else type(model.module).__name__


def _load_parameters(
    path: Path, like: LoadedModel | nn.Module, *, dtype: torch.dtype | None, check_values: bool
) -> LoadedModel:
    """A parameters file held by a copy of ``like``'s module (format: ``like``'s)."""
    holder = like if isinstance(like, LoadedModel) else held_model(like)
    state = load_params_file(path, require_finite=check_values)
    try:
        check_compatible(holder.params, state)
    except IncompatibleModelsError as err:
        raise IncompatibleModelsError(f"{path} does not hold {_name(holder)}'s parameters: "
                                      f"{err}") from None  # fmt: skip
    module = copy.deepcopy(holder.module).eval()
    if dtype is not None:
        module.to(dtype)
    with torch.no_grad():
        own = module.state_dict(keep_vars=True)
        for key in holder.params:
            own[key].copy_(state[key])
    return LoadedModel(module, module_params(module), holder.format, path)


def held_model(module: nn.Module) -> LoadedModel:
    """A module the caller holds, as a :class:`~lmckit.formats.LoadedModel` (``path``
    ``None``).

    A zoo model is written as an lmckit checkpoint, a ``transformers`` model as a
    Hugging Face folder of its class (with no source folder, nothing else is copied),
    any other module as a safetensors file of its parameters (:class:`ModuleFormat`).
    The module itself is referenced, not copied: lmckit never changes it.

    Raises:
        TypeError: ``module`` is not an ``nn.Module`` (naming where a loaded model's is).
    """
    module = as_module(module)
    if isinstance(module, ZooModel):
        return held_checkpoint(module)
    config: Any = getattr(module, "config", None)
    if getattr(module, "main_input_name", None) is not None and hasattr(config, "to_dict"):
        return held_hf(module)
    return LoadedModel(module, module_params(module), ModuleFormat(), None)


def check_same_architecture(a: LoadedModel, b: LoadedModel) -> None:
    """Refuse two models that do not compute the same function of their weights.

    Same format, same parameter names and shapes, and the same configuration, as the
    format judges it (:meth:`~lmckit.formats._loaded.ModelFormat.differences`): an lmckit
    checkpoint's ``ModelConfig``; a Hugging Face folder's class, every config entry that
    changes what it computes (activation, heads, norm epsilon, rotary settings, ...; see
    :func:`lmckit.hf._model.config_differences`) and each weight's stored dtype; another
    module's class. Two folders of one class and shape can still differ
    (``activation_function: relu``, ``n_head: 4``): B's weights would then be evaluated
    with A's config.

    Raises:
        IncompatibleModelsError: naming the first difference.
    """
    if a.format.name != b.format.name:
        described = (m.format.describe(m.module) for m in (a, b))
        raise IncompatibleModelsError(" and ".join(described))
    check_compatible(a.params, b.params)
    _refuse(a.format.differences(b.format, (a.module, b.module)))


def check_same_config(
    a: LoadedModel, b: LoadedModel, *, ignore: frozenset[str] = frozenset()
) -> None:
    """The checks of :func:`check_same_architecture` that no recorded form explains (a
    Hugging Face folder's config entries and stored dtypes; a checkpoint's config changes
    with its form and is compared in it): ``barrier`` and ``merge`` run it on a model
    ``lmckit align`` wrote beside another.

    Args:
        a, b: the models.
        ignore: config entries not compared (``tie_word_embeddings``, which a form that
            folds a scale into a tied head turns off).

    Raises:
        IncompatibleModelsError: naming the first difference.
    """
    if a.format.name != b.format.name:
        return  # the formats are compared in the form
    found = a.format.differences(b.format, (a.module, b.module), full=False)
    _refuse([d for d in found if d.split(":")[0] not in ignore])


def _refuse(differences: list[str]) -> None:
    if not differences:
        return
    first = differences[0]
    if first.startswith("stored dtype: "):
        dtypes, key = first.removeprefix("stored dtype: ").rsplit(": ", 1)
        raise IncompatibleModelsError(
            f"their weights are stored in different dtypes ({dtypes.replace(' vs ', ' and ')}), "
            f"{key} first; save one in the other's dtypes first"
        )
    more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
    raise IncompatibleModelsError(f"their configs differ in {first}{more}")


def save_model(
    path: str | os.PathLike[str],
    like: LoadedModel,
    params: Mapping[str, Tensor],
    *,
    metadata: Mapping[str, Any] | None = None,
    module: ZooModel | None = None,
    config_changes: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    dtype: torch.dtype | None = None,
    sources: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Write ``params`` in the format ``like`` came in (its format's ``save``).

    ``path`` follows lmckit's output policy (:func:`lmckit.outputs.check_output_dir`,
    ``kind=like.output_kind``): a new or empty folder, or an lmckit output of that
    format (replaced); never ``like``'s own folder, a folder inside or around it, the
    working directory or one of its parents.

    Args:
        path: the output folder (replaced atomically), or file for a module's parameters.
        like: the loaded model whose architecture ``params`` belong to.
        params: the weights to write.
        metadata: what lmckit did and its inputs (a checkpoint's ``config.json``
            ``metadata``; a Hugging Face folder's ``lmckit.json``).
        module: lmckit format only: the architecture to write when it differs from
            ``like``'s (e.g. after a rewrite to RMSNorm).
        config_changes: Hugging Face format only: ``config.json`` entries to change.
        overwrite: also replace a non-empty folder (or, for a module's safetensors file,
            a file) lmckit did not write (the command line's ``--force``).
        dtype: Hugging Face format only: the floating dtype to store the weights in;
            ``None``: the source folder's, weight by weight (a bfloat16 folder stays
            bfloat16, its float32 norms float32).
        sources: Hugging Face format only: other folders the weights derive from (a
            merge's other model), whose licenses the model card carries.

    Raises:
        ParameterError: an option of another format.
        OutputError: ``path`` may not be written (the message says why).
        TypeError: ``like`` or ``params`` of the wrong kind, named.
        CheckpointError / HFError: params that do not fit, or that cannot be written;
            nothing is written then.
    """
    check_float_dtype(dtype)
    if not isinstance(like, LoadedModel):
        raise TypeError(
            f"like must be the LoadedModel the params belong to (lmckit.load(path)), "
            f"got {type(like).__name__}"
        )
    as_params(params)
    return like.format.save(path, like, params, metadata=metadata, overwrite=overwrite,
                            dtype=dtype, sources=sources, module=module,
                            config_changes=config_changes)  # fmt: skip
