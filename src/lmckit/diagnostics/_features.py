"""Capture what named submodules receive or emit when a parameter set runs through a model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

__all__ = ["module_features"]

_WHICH = ("output", "input")


def module_features(
    model: nn.Module,
    params: Mapping[str, Tensor],
    x: Tensor,
    sites: Sequence[str],
    *,
    which: str = "output",
) -> dict[str, Tensor]:
    """Outputs (or first inputs) of the modules named ``sites`` on the batch ``x``.

    The model runs in eval mode with ``params`` through ``functional_call``, so one
    module serves any parameter set.

    Args:
        model: module of the architecture.
        params: parameters (and buffers) to run it with.
        x: input batch ``(batch, ...)``.
        sites: module names from ``model.named_modules()``.
        which: ``output`` (what the module emits) or ``input`` (its first argument, e.g. a
            Linear layer's input or an activation's pre-activation).

    Returns:
        ``{site: tensor (batch, ...)}``, detached.
    """
    if which not in _WHICH:
        raise ValueError(f"which must be one of {_WHICH}, got {which!r}")
    if not sites:
        raise ValueError("no sites given")
    modules = dict(model.named_modules())
    missing = [s for s in sites if s not in modules]
    if missing:
        known = ", ".join(n for n in modules if n)
        raise ValueError(f"modules {missing} are not in the model; known modules: {known}")
    captured: dict[str, Tensor] = {}

    def hook(name: str):
        def fn(_module: nn.Module, inputs: tuple, output: Tensor) -> None:
            captured[name] = (inputs[0] if which == "input" else output).detach()

        return fn

    handles = [modules[s].register_forward_hook(hook(s)) for s in dict.fromkeys(sites)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            functional_call(model, dict(params), (x,))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {s: captured[s] for s in sites}
