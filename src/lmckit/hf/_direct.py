"""Writing weights straight into the layout of the folder they were read from.

An aligned or merged model of the same architecture and config as its source folder
holds the source's tensors under the source's on-disk names and shapes. Such weights are
written as the source stores its own: each shard file of the source's layout (or its one
``model.safetensors``) gets the same tensors, each read from the params (computed there,
if they are lazy), rounded to the stored dtype and written before the next is read
(:func:`lmckit.hf._layout.write_shards`); ``config.json`` is the source's with the
changes applied. No module is built and no second copy of the model is made: writing
costs the largest tensor, not the model. :func:`direct_plan` says when this holds;
otherwise :func:`lmckit.hf.save_hf` lets ``transformers`` build and save the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmckit.hf._files import CONFIG_FILE, HFError, read_hf_header
from lmckit.hf._layout import StoredLayout, write_index, write_shards
from lmckit.symmetry._params import layout, rounded_finite

__all__ = ["direct_plan", "write_direct"]

#: the one file of an unsharded folder
SINGLE_FILE = "model.safetensors"


def direct_plan(
    source: Path | None,
    stored: StoredLayout,
    params: Mapping[str, Tensor],
    *,
    changes: Mapping[str, Any],
    untied: Sequence[Sequence[str]],
    tied: Mapping[str, str],
) -> dict[str, list[str]] | None:
    """The files to write and the names each holds, or ``None`` when ``params`` are not
    the source's tensors as it stores them.

    Args:
        source: the source folder (``None``: a model held in memory).
        stored: its layout (:func:`lmckit.hf._layout.stored_layout`).
        params: the weights to write, under in-memory names.
        changes: the config changes (only untying keeps the source's layout).
        untied: ``[target, source]`` weight pairs the output unties (written apart).
        tied: ``{target: source}`` of the weights the output's config still ties (held
            once, written once, as the source holds them).
    """
    if source is None or set(changes) - {"tie_word_embeddings"}:
        return None
    header = read_hf_header(source)
    if header is None:
        return None
    shapes = {k: tuple(v.shape) for k, v in layout(params).items()}
    written = {k: s for k, (_, s) in header.items()}
    for target, _ in untied:
        if target in written or target not in shapes:
            return None
        written[target] = shapes[target]
    if any(shapes.get(k) != tuple(s) for k, s in written.items()):
        return None  # a name the source stores that the params lack, or another shape
    if any(k not in written and k not in tied for k in shapes):
        return None  # a weight the source does not store
    if stored.shards is None:
        return {SINGLE_FILE: sorted(written)}
    files = list(dict.fromkeys(stored.shards.values()))
    plan: dict[str, list[str]] = {file: [] for file in files}
    for name in sorted(written):  # a new name (an untied head) joins the last shard
        plan[stored.shards.get(name, files[-1])].append(name)
    return plan


def write_direct(
    folder: Path,
    plan: Mapping[str, Sequence[str]],
    params: Mapping[str, Tensor],
    config: Mapping[str, Any],
    dtype: torch.dtype | None,
    dtypes: Mapping[str, torch.dtype] | None = None,
    *,
    sharded: bool,
    what: str,
) -> None:
    """Write ``plan``'s files of ``params`` (each floating tensor in its own stored dtype
    from ``dtypes``, else in ``dtype``, ``None``: as it is) and ``config`` into
    ``folder``, with an index when ``sharded``.

    Raises:
        HFError: a tensor holding a NaN or an infinity (naming it; ``what`` says what
            was being written).
    """
    meta = layout(params)

    def stored(key: str) -> torch.dtype:
        own = meta[key].dtype
        if not own.is_floating_point:
            return own
        return (dtypes or {}).get(key) or dtype or own

    shapes = {name: (stored(name), tuple(meta[name].shape)) for names in plan.values()
              for name in names}  # fmt: skip

    def read(name: str) -> Tensor:
        try:
            return rounded_finite(params[name].detach(), stored(name), name=name,
                                  what=f"refusing to write {what}")  # fmt: skip
        except ValueError as err:
            raise HFError(str(err)) from None

    weight_map, total = write_shards(folder, plan, shapes, read)
    if sharded:
        write_index(folder, weight_map, total)
    raw = dict(config)
    name = str(dtype).removeprefix("torch.") if dtype is not None else None
    for key in ("dtype", "torch_dtype"):
        if name is not None and key in raw:
            raw[key] = name
    (folder / CONFIG_FILE).write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
