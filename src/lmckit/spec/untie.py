"""Untie a shared weight for one of its readers: ``W`` read twice becomes two parameters.

A norm scale folds into the layer reading its output (:mod:`lmckit.spec.fold`), but not
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

from torch import nn

from lmckit.params import Params

__all__ = ["untied_module", "untied_params"]


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


def untied_params(params: Params, keys: dict[str, str]) -> Params:
    """``params`` with an entry for every untied key: the shared tensor (not copied)."""
    return {**params, **{key: params[tied] for key, tied in keys.items()}}


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its own dicts of submodules and parameters (the
    submodules and tensors themselves shared)."""
    out = copy.copy(module)
    out._modules = dict(module._modules)
    out._parameters = dict(module._parameters)
    return out
