"""Models in and out, in either format: an lmckit checkpoint or a Hugging Face folder.

:func:`load_model` tells the two apart by ``config.json`` (lmckit's names an
``architecture``, Hugging Face's a ``model_type``) and returns one :class:`LoadedModel`;
:func:`held_model` wraps a module the caller holds in the same type; :func:`save_model`
writes new parameters in the format the model came in, so a result goes back to the
ecosystem its input came from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from lmckit.api_checks import check_float_dtype
from lmckit.atomic import atomic_path
from lmckit.checkpoint import CONFIG_FILE, Checkpoint, CheckpointError
from lmckit.checkpoint import load as load_checkpoint
from lmckit.checkpoint import save as save_checkpoint
from lmckit.hf.files import MAX_CONFIG_BYTES, HFError, is_hf_folder, read_json_file
from lmckit.hf.layout import stored_layout
from lmckit.hf.model import HFModel, config_differences, load_hf
from lmckit.hf.save import save_hf
from lmckit.models import ZooModel
from lmckit.outputs import OutputKind, check_output_dir, check_output_file
from lmckit.params import (
    IncompatibleModelsError,
    Params,
    as_module,
    as_params,
    check_compatible,
    check_finite,
    module_params,
)
from lmckit.weightfile import check_state_dict

__all__ = [
    "MODULE_FILE_SUFFIX",
    "LoadedModel",
    "ModelFormat",
    "check_same_architecture",
    "check_same_config",
    "held_model",
    "load_model",
    "model_format",
    "save_model",
]

#: ``"lmckit"``: a checkpoint; ``"hf"``: a Hugging Face folder; ``"module"``: any other
#: module, written as a safetensors file of its parameters.
ModelFormat = Literal["lmckit", "hf", "module"]
#: Suffix of the file a ``"module"``-format model is written to.
MODULE_FILE_SUFFIX = ".safetensors"


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model, and the format it is read from and written in.

    Attributes:
        module: the module, eval mode, weights loaded (a zoo model, a ``transformers``
            model, or any module the caller holds).
        params: its state dict (flat, detached; tied weights once).
        format: ``"lmckit"`` (a checkpoint), ``"hf"`` (a Hugging Face folder) or
            ``"module"`` (any other module: a safetensors file of its parameters).
        path: what was loaded; ``None`` for a module held in memory.
        source: the format's own object: a :class:`~lmckit.checkpoint.Checkpoint` or a
            :class:`~lmckit.hf.HFModel` (``None`` for the ``"module"`` format);
            :func:`save_model` writes from it.
        record: what :meth:`save` records of how the model was made when given no
            ``metadata`` (a merged point's ends, ``t``, fix; ``None``: nothing).
        derived_from: other saved models these weights derive from (a merge's other
            end): a Hugging Face card written by :meth:`save` carries their licenses.
    """

    module: nn.Module
    params: Params
    format: ModelFormat
    path: Path | None
    source: Checkpoint | HFModel | None
    record: Mapping[str, Any] | None = None
    derived_from: tuple[Path, ...] = ()

    @property
    def output_kind(self) -> OutputKind:
        """The ``kind`` for :func:`lmckit.outputs.check_output_dir` of a result in this format
        (a ``"module"``-format result is one file, not a folder)."""
        return "hf" if self.format == "hf" else "checkpoint"

    @property
    def inputs(self) -> list[Path]:
        """The paths this model was read from (its own, its source's): never an output."""
        source = getattr(self.source, "path", None)
        return [p for p in {self.path, source} if p is not None]

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> Path:
        """Write this model in its format (:func:`save_model` with its own parameters);
        ``metadata`` defaults to the model's :attr:`record` of how it was made."""
        meta = metadata if metadata is not None else self.record
        return save_model(path, self, self.params, metadata=meta, overwrite=overwrite,
                          sources=self.derived_from)  # fmt: skip


def model_format(path: str | os.PathLike[str]) -> ModelFormat:
    """``"hf"`` for a folder with a Hugging Face ``config.json``, else ``"lmckit"``.

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


def load_model(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = torch.float32,
    check_values: bool = True,
) -> LoadedModel:
    """Load an lmckit checkpoint (folder or weights file) or a Hugging Face folder.

    Args:
        path: the checkpoint or folder.
        dtype: floating dtype of the weights; ``None`` keeps them as stored.
        check_values: refuse NaN and infinite values on loading, which reads every
            value. ``False``: not checked here, for a caller that checks what it reads
            (weight matching does); a Hugging Face folder's safetensors loaded with
            ``dtype=None`` then stay memory-mapped, unread until a weight is used, so
            processes that each align their share of a model read only that share.

    Raises:
        CheckpointError: (or its subclass :class:`~lmckit.hf.HFError`) naming the file
            and the problem.
        TypeError, ValueError: a ``dtype`` that is not a floating-point ``torch.dtype``.
    """
    check_float_dtype(dtype)
    if model_format(path) == "hf":
        hf = load_hf(path, dtype=dtype, check_values=check_values)
        return LoadedModel(hf.module, hf.params, "hf", hf.path, hf)
    ckpt = load_checkpoint(path, dtype=dtype, check_values=check_values)
    return LoadedModel(ckpt.module, ckpt.params, "lmckit", Path(path), ckpt)


def held_model(module: nn.Module) -> LoadedModel:
    """A module the caller holds, as a :class:`LoadedModel` (``path`` ``None``).

    A zoo model is written as an lmckit checkpoint, a ``transformers`` model as a
    Hugging Face folder of its class (with no source folder, nothing else is copied),
    any other module as a safetensors file of its parameters (format ``"module"``).
    The module itself is referenced, not copied: lmckit never changes it.

    Raises:
        TypeError: ``module`` is not an ``nn.Module`` (naming where a loaded model's is).
    """
    module = as_module(module)
    params = module_params(module)
    if isinstance(module, ZooModel):
        ckpt = Checkpoint(module, params, module.config)
        return LoadedModel(module, params, "lmckit", None, ckpt)
    config: Any = getattr(module, "config", None)
    if getattr(module, "main_input_name", None) is not None and hasattr(config, "to_dict"):
        # a transformers model: its config is all a Hugging Face folder needs
        raw = config.to_dict()
        hf = HFModel(module, params, raw, type(module).__name__, None)
        return LoadedModel(module, params, "hf", None, hf)
    return LoadedModel(module, params, "module", None, None)


_FORMAT_NAMES = {"lmckit": "an lmckit model", "hf": "a Hugging Face model", "module": "a module"}


def _described(model: LoadedModel) -> str:
    return f"{_FORMAT_NAMES[model.format]} ({type(model.module).__name__})"


def check_same_architecture(a: LoadedModel, b: LoadedModel) -> None:
    """Refuse two models that do not compute the same function of their weights.

    Same format, same parameter names and shapes, and the same configuration: an lmckit
    checkpoint's ``ModelConfig``; a Hugging Face folder's class and every config entry
    that changes what it computes (activation, heads, norm epsilon, rotary settings, ...;
    see :func:`lmckit.hf.model.config_differences`). Two folders of one class and shape
    can still differ (``activation_function: relu``, ``n_head: 4``): B's weights would
    then be evaluated with A's config.

    Two Hugging Face folders must also store their weights in one floating dtype.

    Raises:
        IncompatibleModelsError: naming the first difference.
    """
    if a.format != b.format:
        raise IncompatibleModelsError(f"{_described(a)} and {_described(b)}")
    check_compatible(a.params, b.params)
    if isinstance(a.source, HFModel) and isinstance(b.source, HFModel):
        check_same_config(a, b)
    elif isinstance(a.source, Checkpoint) and isinstance(b.source, Checkpoint):
        if a.source.config != b.source.config:
            raise IncompatibleModelsError(f"{a.source.config} vs {b.source.config}")
    elif type(a.module) is not type(b.module):
        names = type(a.module).__name__, type(b.module).__name__
        raise IncompatibleModelsError(f"a {names[0]} and a {names[1]}")


def check_same_config(
    a: LoadedModel, b: LoadedModel, *, ignore: frozenset[str] = frozenset()
) -> None:
    """The checks of :func:`check_same_architecture` beyond names and shapes, for two
    Hugging Face models: every config entry that changes what they compute, and each
    weight's stored dtype. ``barrier`` and ``merge`` run it on a model ``lmckit align``
    wrote beside another (their shapes are compared once both are in the recorded form).

    Args:
        a, b: the models (nothing is checked unless both are Hugging Face models).
        ignore: config entries not compared (``tie_word_embeddings``, which a form that
            folds a scale into a tied head turns off).

    Raises:
        IncompatibleModelsError: naming the first config entry, or the first weight,
            that differs.
    """
    if not (isinstance(a.source, HFModel) and isinstance(b.source, HFModel)):
        return
    differences = [d for d in config_differences(a.source, b.source)
                   if d.split(":")[0] not in ignore]  # fmt: skip
    if differences:
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        raise IncompatibleModelsError(f"their configs differ in {differences[0]}{more}")
    # the output is stored as B is, weight by weight: two storages would leave one unsaid
    stored_a, stored_b = stored_layout(a.source.path), stored_layout(b.source.path)
    for name in sorted(stored_a.dtypes.keys() & stored_b.dtypes.keys()):
        da, db = stored_a.dtypes[name], stored_b.dtypes[name]
        if da != db:
            dtypes = [str(d).removeprefix("torch.") for d in (da, db)]
            raise IncompatibleModelsError(
                f"their weights are stored in different dtypes ({dtypes[0]} and {dtypes[1]}), "
                f"{name} first; save one in the other's dtypes first"
            )


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
    """Write ``params`` in the format ``like`` came in.

    ``path`` follows lmckit's output policy (:func:`lmckit.outputs.check_output_dir`,
    ``kind=like.output_kind``): a new or empty folder, or an lmckit output of that
    format (replaced); never ``like``'s own folder, a folder inside or around it, the
    working directory or one of its parents.

    Args:
        path: the output folder (replaced atomically).
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
        ValueError: an option of the other format.
        OutputError: ``path`` may not be written (the message says why).
        TypeError: ``like`` or ``params`` of the wrong kind, named.
        CheckpointError / HFError: params that do not fit, or that cannot be written;
            nothing is written then.
    """
    check_float_dtype(dtype)
    if not isinstance(like, LoadedModel):
        raise TypeError(
            f"like must be the LoadedModel the params belong to (lmckit.load_model(path)), "
            f"got {type(like).__name__}"
        )
    as_params(params)
    if dtype is not None and like.format != "hf":
        raise ValueError("dtype= is for Hugging Face folders")
    if like.format == "module":
        if module is not None or config_changes is not None:
            raise ValueError("module= and config_changes= are for checkpoints and folders")
        return _save_module_file(path, like, params, metadata=metadata, overwrite=overwrite)
    if dtype is not None and like.format != "hf":
        raise ValueError("dtype= is for Hugging Face folders")
    check_output_dir(path, kind=like.output_kind, inputs=like.inputs, force=overwrite)
    if like.format == "hf":
        if module is not None:
            raise ValueError(
                "module= is for lmckit checkpoints; a Hugging Face folder keeps its class"
            )
        assert isinstance(like.source, HFModel)
        return save_hf(
            path,
            like.source,
            params,
            config_changes=config_changes,
            metadata=metadata,
            overwrite=overwrite,
            dtype=dtype,
            sources=[p for p in sources if is_hf_folder(p)],
        )
    if config_changes is not None:
        raise ValueError("config_changes= is for Hugging Face folders; pass module= instead")
    assert isinstance(like.source, Checkpoint)
    arch = module if module is not None else like.source.config
    return save_checkpoint(path, arch, params, metadata=metadata, overwrite=overwrite)


def _save_module_file(
    path: str | os.PathLike[str],
    like: LoadedModel,
    params: Mapping[str, Tensor],
    *,
    metadata: Mapping[str, Any] | None,
    overwrite: bool,
) -> Path:
    """``params`` as one safetensors file (``module.load_state_dict(load_file(path))``
    restores them; tied weights are stored once, under their first name). An existing
    file is replaced if lmckit wrote it (its header says so), or with ``overwrite``."""
    target = check_output_file(
        path, inputs=like.inputs, suffixes=[MODULE_FILE_SUFFIX], force=overwrite, kind="weights"
    )
    state = check_state_dict(dict(params), target)
    check_compatible(like.params, state)
    try:
        check_finite(state, what=f"refusing to write {target}")
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    meta = {"lmckit": json.dumps(dict(metadata or {}), allow_nan=False)}
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    with atomic_path(target) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt", **meta})
    return target
