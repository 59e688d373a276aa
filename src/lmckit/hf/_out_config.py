"""The config a written Hugging Face folder carries: the source's with the caller's changes.

Weights tied when loaded that no longer are (an aligned LM head) untie the config so that
both are written; changes that would make the folder another class than its weights', or
drop a weight the params hold only under the name it was tied to, are refused (what
:func:`~lmckit.hf.load_hf` would refuse in the folder written).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmckit.formats._loaded import LoadedModel
from lmckit.hf._build import make_config, tied_keys
from lmckit.hf._files import HFError

__all__ = ["check_class_kept", "check_ties_written", "config_for"]


def check_class_kept(cls: type, config: Any, changes: Mapping[str, Any], target: Path) -> None:
    """Refuse config changes that make the folder another class than its weights', which
    :func:`~lmckit.hf.load_hf` would refuse (or build as that other class)."""
    archs = changes.get("architectures")
    if "architectures" in changes and (not isinstance(archs, list) or archs[:1] != [cls.__name__]):
        raise HFError(
            f"cannot write {target}: config_changes set architectures to {archs!r}, but the "
            f"weights are a {cls.__name__}'s (a folder keeps its class)"
        )
    expected = getattr(cls, "config_class", None)
    if isinstance(expected, type) and not isinstance(config, expected):
        raise HFError(
            f"cannot write {target}: {cls.__name__} takes a {expected.__name__}, but "
            f"config_changes make it a {type(config).__name__} (model_type "
            f"{getattr(config, 'model_type', None)!r}); a folder keeps its class"
        )


def check_ties_written(
    cls: type,
    like: LoadedModel,
    tied: Mapping[str, str],
    params: Mapping[str, Tensor],
    target: Path,
) -> None:
    """Refuse config changes that untie a weight ``params`` hold only once (under the name
    it is tied to): the folder would lack it, and :func:`~lmckit.hf.load_hf` would
    refuse it."""
    before = tied_keys(cls, make_config(like.format.config, target))
    for name, source in sorted(before.items()):
        if name not in tied and name not in params and source in params:
            raise HFError(
                f"cannot write {target}: the config changes untie {name} from {source}, but "
                f"the params hold it only as {source}; give {name} too"
            )


def _differing_ties(tied: Mapping[str, str], state: Mapping[str, Tensor]) -> list[tuple[str, str]]:
    return [
        (target, source)
        for target, source in sorted(tied.items())
        if target in state and source in state and not torch.equal(state[target], state[source])
    ]


def config_for(
    cls: type,
    source: Mapping[str, Any],
    changes: dict[str, Any],
    state: Mapping[str, Tensor],
    target: Path,
) -> tuple[Any, list[list[str]], dict[str, str]]:
    """The output's config (``source`` with ``changes``), the weight pairs it unties and
    the ``{target: source}`` weights it still ties.

    Weights tied when loaded that no longer are (an aligned LM head) untie the config,
    recorded in ``changes``, so that both are written and loaded as they are.
    """
    raw = {**source, **changes}
    config = make_config(raw, target)
    tied = tied_keys(cls, config)
    differ = _differing_ties(tied, state)
    untied: list[list[str]] = []
    if differ and getattr(config, "tie_word_embeddings", False):
        changes["tie_word_embeddings"] = False
        raw["tie_word_embeddings"] = False
        config = make_config(raw, target)
        untied = [list(pair) for pair in differ]
        tied = tied_keys(cls, config)
        differ = _differing_ties(tied, state)
    if differ:
        t, s = differ[0]
        raise HFError(f"cannot write {target}: {cls.__name__} ties {t} to {s}, but they differ")
    return config, untied, tied
