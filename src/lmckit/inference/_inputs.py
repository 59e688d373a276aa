"""Example inputs as a user gives them: a tensor, a tuple of positional inputs, or a dict.

Every function that runs a module on example inputs (:func:`lmckit.infer_spec`,
:func:`lmckit.analyze_symmetries`, :func:`lmckit.check_spec`,
:func:`lmckit.aligned_form`) takes them in any of three forms, the natural first call
included:

* a tensor: the one positional input (``infer_spec(model, x)``);
* a tuple or list: the positional inputs, in order (``(x,)``, or what
  :func:`lmckit.hf.example_inputs` returns);
* a dict (e.g. a tokenizer's output): keyword inputs (``{"input_ids": ids}``).

Anything else is refused in one line naming what is expected, and inputs that do not
match the module's ``forward`` are refused naming its signature, before any tracing.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from torch import Tensor, nn

__all__ = ["ExampleInputs", "bind_inputs", "describe_inputs", "split_inputs"]

#: A tensor, a tuple or list of positional inputs, or a dict of keyword inputs.
ExampleInputs: TypeAlias = Tensor | Sequence[Any] | Mapping[str, Any]

_EXPECTED = (
    "a tensor (the one input), a tuple of the positional inputs, or a dict of keyword inputs"
)


def split_inputs(
    example_inputs: object,
    kwargs: Mapping[str, Any] | None = None,
    *,
    module: nn.Module | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(positional, keyword)`` inputs from example inputs in any accepted form.

    Args:
        example_inputs: a tensor, a tuple/list of positional inputs, or a dict of
            keyword inputs (string keys).
        kwargs: further keyword inputs (given apart); may not repeat a dict's keys.
        module: the module the inputs are for: when its ``forward`` takes ``use_cache``
            and it is not given, ``use_cache=False`` is added. A decoder's key-value
            cache is state for the next call, not part of the function, and
            ``torch.export`` cannot flatten it (``transformers`` decoders return one by
            default).

    Raises:
        TypeError: any other type, naming it and what is expected; a dict with a
            non-string key; a keyword given twice.
    """
    extra = dict(kwargs or {})
    if module is not None and "use_cache" not in extra and _takes(module, "use_cache"):
        if not (isinstance(example_inputs, Mapping) and "use_cache" in example_inputs):
            extra["use_cache"] = False
    if isinstance(example_inputs, Tensor):
        return (example_inputs,), extra
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), extra
    if isinstance(example_inputs, Mapping):
        keys = list(example_inputs)
        bad = next((k for k in keys if not isinstance(k, str)), None)
        if bad is not None:
            raise TypeError(f"example inputs given as a dict need string keys, got {bad!r}")
        twice = sorted(set(keys) & extra.keys())
        if twice:
            raise TypeError(f"keyword input {twice[0]!r} is given twice (in the dict and kwargs)")
        return (), {**dict(example_inputs), **extra}
    raise TypeError(f"example inputs must be {_EXPECTED}; got {_kind(example_inputs)}")


def _takes(module: nn.Module, name: str) -> bool:
    """Whether ``module.forward`` has a parameter called ``name``."""
    try:
        return name in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def _kind(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_kind(v) for v in value[:3]) + (", ..." if len(value) > 3 else "")
        return f"a {type(value).__name__} ({inner})"
    if isinstance(value, Mapping):
        return f"a dict with keys {', '.join(map(str, list(value)[:5]))}"
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def describe_inputs(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The inputs in a few words, for messages: ``"a tensor (4, 3, 32, 32)"``."""
    parts = [_kind(a) for a in args] + [f"{k}={_kind(v)}" for k, v in kwargs.items()]
    text = ", ".join(parts) or "no inputs"
    if any(isinstance(a, (tuple, list)) for a in args):
        # the tuple lmckit.hf.example_inputs returns, wrapped once more: (inputs,)
        text += " (an input is itself a tuple: pass a tuple of inputs as it is, not inside another)"
    return text


def bind_inputs(module: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse inputs that ``module.forward`` cannot take, naming its signature.

    Raises:
        TypeError: e.g. four positional inputs for ``forward(input)`` (a tensor passed as
            a sequence of rows: pass it alone or as ``(x,)``).
    """
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):  # a forward without a signature: tracing will tell
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        names = list(signature.parameters)
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise TypeError(
            f"example inputs ({describe_inputs(args, kwargs)}) do not fit "
            f"{type(module).__name__}.forward({shown}): {err}"
        ) from None
