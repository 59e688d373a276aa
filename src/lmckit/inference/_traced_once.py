"""Each graph traced once: the traced graphs of configured modules, kept by what they are.

A command reads one architecture's graph several times: the spec of model A, the
analysis a rewrite reads (folding norm scales, LayerNorm -> RMSNorm, circuits), the
same rewrite of model B, the spec of the rewritten form. ``torch.export`` is the
expensive part (about 30 s for a 1.1B model). The graph depends on the architecture and
the example inputs' shapes, not on the weights: two modules of one class and one
configuration (a zoo model's ``config``, a ``transformers`` model's config), with the
same parameter names, shapes, dtypes and ties, traced on inputs of the same shapes, have
the same graph. :func:`traced_once` keeps the last few graphs by that key and traces a
module only when its key is new. A module without a configuration (a user's own
``nn.Module``, whose code may read any attribute) is traced every time.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lmckit.inference._trace import TracedGraph, trace

__all__ = ["clear_traces", "graph_key", "traced_once"]

#: Graphs kept (the forms of one command: the model's own, RMSNorm, circuits, a fold).
KEPT = 6
_GRAPHS: OrderedDict[Hashable, TracedGraph] = OrderedDict()


def _config_key(module: nn.Module) -> str | None:
    """The module's configuration as text, or ``None`` when it has none lmckit knows."""
    config: Any = module.__dict__.get("config")
    if config is None:
        return None
    if hasattr(config, "to_dict"):  # a transformers PretrainedConfig
        try:
            return json.dumps(config.to_dict(), sort_keys=True, default=repr)
        except (TypeError, ValueError):
            return None
    if type(module).__module__.startswith("lmckit."):  # a zoo ModelConfig
        return repr(config)
    return None


def _shapes(values: Sequence[Any] | Mapping[str, Any]) -> tuple[Any, ...]:
    items = values.items() if isinstance(values, Mapping) else enumerate(values)
    return tuple(
        (k, tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else (k, repr(v))
        for k, v in items
    )


def graph_key(
    module: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> Hashable | None:
    """What the graph of ``module`` on ``args`` depends on, or ``None`` (traced every time)."""
    config = _config_key(module)
    if config is None:
        return None
    state = module.state_dict(keep_vars=True)
    ties: dict[int, list[str]] = {}
    for name, tensor in state.items():
        ties.setdefault(id(tensor), []).append(name)
    layout = tuple((k, tuple(v.shape), str(v.dtype), v.device.type) for k, v in state.items())
    tied = tuple(tuple(names) for names in ties.values() if len(names) > 1)
    kind = f"{type(module).__module__}.{type(module).__qualname__}"
    return (kind, config, layout, tied, _shapes(args), _shapes(dict(kwargs or {})))


def traced_once(
    module: nn.Module, args: Sequence[Any], *, kwargs: Mapping[str, Any] | None = None
) -> TracedGraph:
    """:func:`~lmckit.inference._trace.trace`, or the graph traced before for the same key
    (:func:`graph_key`)."""
    key = graph_key(module, args, kwargs)
    if key is None:
        return trace(module, args, kwargs=kwargs)
    if key in _GRAPHS:
        _GRAPHS.move_to_end(key)
        return _GRAPHS[key]
    traced = trace(module, args, kwargs=kwargs)
    _GRAPHS[key] = traced
    while len(_GRAPHS) > KEPT:
        _GRAPHS.popitem(last=False)
    return traced


def clear_traces() -> None:
    """Forget every graph kept (tests that count traces start from none)."""
    _GRAPHS.clear()
