"""Writing parameters back as a Hugging Face folder that ``transformers`` loads.

:func:`save_hf` writes parameters that are the source folder's own tensors (its names,
shapes and config: an aligned or merged model) straight into the source's layout, one
tensor at a time (:mod:`lmckit.hf._direct`); anything else it builds as the source's
class from its config (with the requested changes) and lets ``transformers`` write
(``save_pretrained``: safetensors, its own on-disk names, a tied weight once). It copies
the source's other files (tokenizer, generation config, model card; never through a
symbolic link out of the folder, never a file over 256 MiB) and adds
:data:`~lmckit.outputs.HF_MARKER` (``lmckit.json``): lmckit's version, the source folder,
the config changes, the caller's metadata and the list of files written, which marks the
folder as lmckit's own for :func:`lmckit.outputs.is_lmckit_output`. The folder appears
at once (atomic rename).
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmckit._arguments import check_float_dtype
from lmckit.formats._loaded import LoadedModel
from lmckit.hf._build import build_module, import_transformers, keep_dtypes, quiet
from lmckit.hf._card import model_card
from lmckit.hf._direct import direct_plan, write_direct
from lmckit.hf._files import CONFIG_FILE, HFError, copy_refusal
from lmckit.hf._layout import reshard, stored_layout
from lmckit.hf._out_config import check_class_kept, check_ties_written, config_for
from lmckit.outputs import check_output_dir
from lmckit.outputs._atomic import atomic_dir, write_json
from lmckit.outputs._folders import HF_MARKER
from lmckit.symmetry._params import LazyParams, Params, check_finite, rounded_finite

__all__ = ["CARD_FILE", "WEIGHT_SUFFIXES", "save_hf"]

#: The model card a written folder holds (the source's, if any, is kept inside it).
CARD_FILE = "README.md"

#: Files of the source that are never copied: weights in any format (they would hold
#: the source's values), and what :func:`save_hf` writes itself.
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".onnx",
    ".gguf",
    ".tflite",
    ".ot",
    ".index.json",
)


def _version() -> str:
    try:
        return _metadata.version("lmckit")
    except _metadata.PackageNotFoundError:
        return "unknown"


def _files_to_copy(source: Path | None) -> tuple[list[Path], dict[str, str]]:
    """Non-hidden, non-weight files at the top of ``source`` that may be copied, and
    ``{name: why not}`` for every other entry but the config and weights, which are
    written anew (a subfolder, a hidden entry, :func:`~lmckit.hf._files.copy_refusal`);
    nothing for a model held in memory (no ``source``)."""
    if source is None or not source.is_dir():
        return [], {}
    skip = {CONFIG_FILE, HF_MARKER}
    copies, refused = [], {}
    for entry in sorted(source.iterdir()):
        if entry.name in skip or entry.name.lower().endswith(WEIGHT_SUFFIXES):
            continue
        if entry.name.startswith("."):
            refused[entry.name] = "a hidden entry (never copied)"
            continue
        if entry.is_dir() and not entry.is_symlink():
            refused[entry.name] = "a subfolder (only the files at the top are copied)"
            continue
        reason = copy_refusal(entry, source)
        if reason is None:
            copies.append(entry)
        else:
            refused[entry.name] = reason
    return copies, refused


def _card_of(folder: Path) -> str:
    """The model card of another source folder, read as its files are copied (a regular
    file inside it, under the size cap), or ``""``."""
    copies, _ = _files_to_copy(folder)
    card = next((f for f in copies if f.name == CARD_FILE), None)
    return card.read_text(errors="replace") if card is not None else ""


def _check_entry(key: object, value: object, target: Path) -> None:
    if not isinstance(key, str) or not isinstance(value, Tensor):
        raise HFError(f"cannot write {target}: params must map names to tensors ({key!r})")


def _check_readable_kinds(like: LoadedModel, params: Mapping[str, Tensor], target: Path) -> None:
    """Refuse what :func:`~lmckit.hf.load_hf` would refuse in the folder written:
    a weight that is not floating point where the model computes in floating point."""
    reference = {**like.module.state_dict(), **like.params}
    for key, value in params.items():
        ref = reference.get(key)
        if ref is not None and ref.is_floating_point() and not value.is_floating_point():
            raise HFError(
                f"cannot write {target}: weight {key} is {value.dtype}, not floating point; "
                "lmckit needs floating-point weights (float32, float16, bfloat16 or float64)"
            )


def _checked_params(
    params: Mapping[str, Tensor],
    target: Path,
    dtype: torch.dtype | None = None,
    dtypes: Mapping[str, torch.dtype] | None = None,
) -> Params:
    """``params`` as a plain state dict, each floating tensor in its own stored dtype
    (``dtypes``), else ``dtype`` (``None``: as given), rounded as it is read (a lazily
    computed float32 tensor never waits beside the others)."""
    state: Params = {}
    what = f"refusing to write {target}"
    for key, value in params.items():
        _check_entry(key, value, target)
        value = value.detach()
        want = (dtypes or {}).get(key, dtype)
        try:
            if want is not None and value.is_floating_point():
                value = rounded_finite(value, want, name=key, what=what)
            else:
                check_finite({key: value}, what=what)
        except ValueError as err:
            raise HFError(str(err)) from None
        # contiguous: save_pretrained views every tensor flat (aligned weights may be
        # permuted views of another tensor)
        state[key] = value.contiguous()
    return state


def _float_dtype(state: Params) -> torch.dtype | None:
    """The floating dtype most of ``state``'s floating tensors have."""
    counts = Counter(v.dtype for v in state.values() if v.is_floating_point())
    return counts.most_common(1)[0][0] if counts else None


def _stored_state(
    params: Mapping[str, Tensor],
    dtype: torch.dtype | None,
    dtypes: Mapping[str, torch.dtype],
    target: Path,
) -> tuple[Params, torch.dtype | None]:
    """The checked params in the dtypes they are stored in (each its own from
    ``dtypes``, else ``dtype``; ``None``: as given), and the main one."""
    if dtype is not None and not dtype.is_floating_point:
        raise HFError(f"cannot write {target}: dtype must be a floating-point dtype, got {dtype}")
    state = _checked_params(params, target, dtype, dtypes)
    return state, _float_dtype(state)


def _tensor_dtypes(
    stored: Mapping[str, torch.dtype], untied: list[list[str]]
) -> dict[str, torch.dtype]:
    """Each weight's stored dtype, an untied weight taking the one it was tied to."""
    out = dict(stored)
    for target, source in untied:
        if source in out:
            out.setdefault(target, out[source])
    return out


def _dtype_name(dtype: torch.dtype | None, dtypes: Mapping[str, torch.dtype]) -> str | None:
    """The stored dtype for the model card: the main one, and the others with counts."""
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    others = Counter(str(d).removeprefix("torch.") for d in dtypes.values() if d != dtype)
    if others:
        name += " (" + ", ".join(f"{n}: {c} weights" for n, c in sorted(others.items())) + ")"
    return name


def save_hf(
    path: str | os.PathLike[str],
    like: LoadedModel,
    params: Mapping[str, Tensor],
    *,
    config_changes: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    dtype: torch.dtype | None = None,
    sources: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Write ``params`` as a Hugging Face folder of ``like``'s class, stored as ``like``'s.

    ``AutoModel*.from_pretrained(path)`` (the class of ``like``) then computes the
    function of ``like.module`` holding ``params``. Tied weights (an LM head equal to the
    embeddings) are written once while they are still equal; when they differ the
    config gets ``tie_word_embeddings: false`` and both are written. The weights are
    stored as the source folder stores its own (:mod:`lmckit.hf._layout`): in its
    floating dtype (values rounded once, here) and, when it is sharded, in the same
    shard files with a ``model.safetensors.index.json``; when ``params`` are the source's
    tensors under its on-disk names and shapes, each is rounded and written as it is
    read (a lazily computed tensor, e.g. of :class:`~lmckit.inference._fold.FoldedParams`, is
    computed then), so writing costs one tensor, not a copy of the model. A model card
    ``README.md`` says what was done (:mod:`lmckit.hf._card`). Check ``path`` first with
    :func:`lmckit.outputs.check_output_dir` (``kind="hf"``).

    Args:
        path: the folder to write; an existing one is replaced as a whole.
        like: the loaded source (class, config, files to copy).
        params: the weights, under ``like.params``' names (in-memory names; on-disk names
            are accepted too), one floating dtype (written as is unless ``dtype`` or the
            source's storage says otherwise).
        config_changes: entries of ``config.json`` to set, e.g. after a change of shape.
        metadata: what lmckit did and its inputs, stored in ``lmckit.json``.
        overwrite: also replace a non-empty folder lmckit did not write (``--force``).
        dtype: the floating dtype to store; ``None``: the source folder's, weight by
            weight (for a module held in memory, the params' own).
        sources: the other folders the weights derive from (a merge's other model):
            the card carries their licenses beside the source's.

    Returns:
        ``path``.

    Raises:
        HFError: params that do not fit the class and config (missing, unexpected or
            misshapen weights), non-finite or mixed-dtype params, config changes or
            metadata that are not JSON. Nothing is written then.
        OutputError: ``path`` may not be written (it is, contains or lies inside the
            source folder, is a folder lmckit did not write, ...).
    """
    check_float_dtype(dtype)
    source = like.format.source
    inputs = [source] if source is not None else []
    target = check_output_dir(path, kind="hf", inputs=inputs, force=overwrite)
    changes = dict(config_changes or {})
    meta = dict(metadata or {})
    _check_json(changes, meta, target)
    layout = stored_layout(source)
    # each weight keeps the dtype the source stores it in, unless dtype= names one for all
    per_tensor = dict(layout.dtypes) if dtype is None else {}
    dtype = dtype or layout.dtype
    _check_params_given(like, params, dtype, target)
    transformers = import_transformers()
    cls = type(like.module)
    config, untied, tied = config_for(cls, like.format.config, changes, params, target)
    check_class_kept(cls, config, changes, target)
    if config_changes:  # (a meta module more: only when the caller changes the config)
        check_ties_written(cls, like, tied, params, target)
    # the source's own tensors go straight into its layout, one at a time; anything else
    # is built as a module and saved by transformers
    plan = direct_plan(source, layout, params, changes=changes, untied=untied, tied=tied)
    per_tensor = _tensor_dtypes(per_tensor, untied)
    module: Any = None  # a transformers PreTrainedModel (save_pretrained)
    if plan is None:
        module, dtype, per_tensor = _built_module(cls, config, params, dtype, per_tensor, target)
    copies, not_copied = _files_to_copy(source)
    source_card = next((f for f in copies if f.name == CARD_FILE), None)
    copies = [f for f in copies if f.name != CARD_FILE]
    with atomic_dir(target) as tmp:
        if plan is not None:
            write_direct(tmp, plan, params, {**like.format.config, **changes}, dtype, per_tensor,
                         sharded=layout.shards is not None, what=str(target))  # fmt: skip
        else:
            with quiet(transformers):
                module.save_pretrained(tmp)
            del module
            if layout.shards is not None:
                reshard(tmp, layout.shards)
        for file in copies:
            # The source's generation config (and tokenizer files) win over defaults.
            shutil.copyfile(file, tmp / file.name)
        stored = _dtype_name(dtype, per_tensor)
        (tmp / CARD_FILE).write_text(_card(target, meta, stored, source, source_card, sources))
        _match_permissions(tmp)
        provenance = {
            "lmckit_version": _version(),
            "format": "hf",
            "class": cls.__name__,
            "source": str(source) if source is not None else None,
            "config_changes": changes,
            "untied": untied,
            "not_copied": not_copied,
            "metadata": meta,
        }
        files = sorted({entry.name for entry in tmp.iterdir()} | {HF_MARKER})
        write_json(tmp / HF_MARKER, {**provenance, "files": files})
    return target


def _check_json(changes: Mapping[str, Any], meta: Mapping[str, Any], target: Path) -> None:
    """Refuse config changes or metadata that ``config.json`` / ``lmckit.json`` cannot hold."""
    try:
        json.dumps({"config_changes": changes, "metadata": meta}, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise HFError(
            f"cannot write {target}: config changes or metadata not JSON: {err}"
        ) from None


def _check_params_given(
    like: LoadedModel, params: Mapping[str, Tensor], dtype: torch.dtype | None, target: Path
) -> None:
    """Refuse a non-floating ``dtype`` and params that are not named tensors of the kinds
    the model computes in (a lazy mapping is checked as each tensor is computed)."""
    if dtype is not None and not dtype.is_floating_point:
        raise HFError(f"cannot write {target}: dtype must be a floating-point dtype, got {dtype}")
    if not isinstance(params, LazyParams):  # a lazy mapping computes tensors by design
        for key, value in params.items():
            _check_entry(key, value, target)
        _check_readable_kinds(like, params, target)


def _built_module(
    cls: type,
    config: Any,
    params: Mapping[str, Tensor],
    dtype: torch.dtype | None,
    per_tensor: Mapping[str, torch.dtype],
    target: Path,
) -> tuple[Any, torch.dtype | None, dict[str, torch.dtype]]:
    """``cls`` built from ``config`` holding ``params`` in their stored dtypes, for
    ``save_pretrained``; with the main stored dtype and each weight's."""
    state, dtype = _stored_state(params, dtype, per_tensor, target)
    module = build_module(cls, config, state, dtype=dtype, where=target)
    keep_dtypes(module, state)
    stored = {k: v.dtype for k, v in state.items() if v.is_floating_point()}
    built = module.state_dict()
    for key, value in state.items():
        # build_module checked names and shapes; this guards against silent re-tying.
        if key in built and not torch.equal(built[key], value):
            raise HFError(f"cannot write {target}: {cls.__name__} does not keep {key} as given")
    return module, dtype, stored


def _card(
    target: Path,
    meta: Mapping[str, Any],
    stored: str | None,
    source: Path | None,
    source_card: Path | None,
    sources: Sequence[str | os.PathLike[str]],
) -> str:
    """The written folder's model card: what was done, above the source's card and the
    licenses of the other folders the weights derive from."""
    card = source_card.read_text(errors="replace") if source_card is not None else ""
    others = [(str(p), _card_of(Path(p))) for p in sources]
    name = str(source) if source is not None else "the source"
    return model_card(target.name, meta, version=_version(), dtype=stored, source_card=card,
                      other_cards=others, source_name=name)  # fmt: skip


def _match_permissions(folder: Path) -> None:
    """safetensors creates its files 0600; give them the config's (umask) permissions."""
    mode = (folder / CONFIG_FILE).stat().st_mode & 0o777
    for weights in folder.glob("*.safetensors"):
        os.chmod(weights, mode)
