"""Old call forms of aligners, accepted until their callers move to the common one.

Before the aligner registry, ``activation_matching`` and ``learned_matching`` took
the module first (``(model, spec, params_a, params_b, inputs_or_data, ...)``) and
``universe_matching`` a list of models (``(spec, models, config, ...)``). The
decorator below routes such calls to an adapter; every new call uses the common
signature of :mod:`lmckit.align.registry`. Remove an adapter once ``grep`` finds no
caller of its old form.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from torch import nn

__all__ = ["legacy_call", "model_and_data_first", "module_first", "models_list"]

F = TypeVar("F", bound=Callable[..., Any])


def module_first(args: tuple[Any, ...]) -> bool:
    """The old ``(model, spec, ...)`` form: an ``nn.Module`` where the spec belongs."""
    return bool(args) and isinstance(args[0], nn.Module)


def models_list(args: tuple[Any, ...]) -> bool:
    """The old ``(spec, models, ...)`` form: a sequence of parameter sets, not one."""
    return len(args) >= 2 and not isinstance(args[1], Mapping)


def legacy_call(is_old: Callable[[tuple[Any, ...]], bool], adapter: Callable[..., Any]):
    """Route calls for which ``is_old(args)`` holds to ``adapter(new_fn, *args, **kw)``."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if is_old(args):
                return adapter(fn, *args, **kwargs)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


def model_and_data_first(
    new: Callable[..., Any],
    model: nn.Module,
    spec: Any,
    params_a: Any,
    params_b: Any,
    data: Any,
    config: Any = None,
    **options: Any,
) -> Any:
    """Adapter for ``fn(model, spec, a, b, data, config, **options)``."""
    return new(spec, params_a, params_b, config, model=model, data=data, **options)
