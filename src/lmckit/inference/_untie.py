"""Untie a shared weight for one of its readers: ``W`` read twice becomes two parameters.

A norm scale folds into the layer reading its output (:mod:`lmckit.inference._fold`), but not
when that layer's weight is tied to another (a language model's output head reading the
final norm shares the token embedding): folding would change the embedding too. Given
its own copy of the weight, the reader can take the scale, and the stream admits
rotations. The function is unchanged (both copies start equal); the written folder
says the weights are no longer tied (:func:`lmckit.hf.save_hf` unties the config).

The caller's module is not changed: :func:`untied_module` returns a shallow copy that
shares every other submodule and tensor.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from torch import Tensor, nn

from lmckit.symmetry._params import Params

__all__ = ["untie_refused", "untied_module", "untied_params"]


def untie_refused(module: nn.Module) -> str | None:
    """Why a model of ``module``'s class cannot be written with its output head untied,
    or None. A module configured by a ``transformers``-style config says so there
    (``tie_word_embeddings``); a class that ties whatever its config says (T5 in recent
    ``transformers``) would load the untied head tied again."""
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "tie_word_embeddings"):
        return None
    try:
        untied = type(config).from_dict({**config.to_dict(), "tie_word_embeddings": False})
    except Exception:  # noqa: BLE001 -- any config that will not rebuild cannot say it
        untied = None
    if untied is None or getattr(untied, "tie_word_embeddings", True):
        name = type(module).__name__
        return f"{name} ties its output head to the embedding whatever its config says"
    return None


def untied_module(module: nn.Module, keys: dict[str, str]) -> nn.Module:
    """``module`` with each parameter ``key`` of ``keys`` (its own state-dict name ->
    the name it is tied to) as a separate parameter, a copy of the shared tensor.

    Only the modules on the path to each key are copied (shallowly); the rest is shared.
    """
    root = _shallow(module)
    for key in keys:
        *path, attr = key.split(".")
        parent = root
        for name in path:
            child = _shallow(parent._modules[name])  # type: ignore[arg-type]
            parent._modules[name] = child
            parent = child
        shared = parent._parameters[attr]
        assert shared is not None, key
        parent._parameters[attr] = nn.Parameter(shared.detach().clone(), shared.requires_grad)
    return root


def untied_params(params: Mapping[str, Tensor], keys: dict[str, str]) -> Params:
    """``params`` with an entry for every untied key: the shared tensor (not copied)."""
    return {**params, **{key: params[tied] for key, tied in keys.items()}}


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its own dicts of submodules and parameters (the
    submodules and tensors themselves shared)."""
    out = copy.copy(module)
    out._modules = dict(module._modules)
    out._parameters = dict(module._parameters)
    return out
