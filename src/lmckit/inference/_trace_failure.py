"""Why a module does not trace, in one line: the module and the line of code that stopped it.

``torch.export`` runs the model's own Python code, so its error carries the frames of
that code. The innermost frame whose ``self`` is a submodule names the module (by its
qualified name, as in the state dict); the innermost frame outside ``torch`` names the
operation (file, line and code). The module is then run once without tracing: if it
fails there too, the inputs or the configuration do not fit the model (a router asked
for more groups of experts than it has), which is no limit of tracing, and the line
says so.
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

__all__ = ["describe_failure"]

_TORCH = os.path.dirname(torch.__file__)
_LMCKIT = os.path.dirname(os.path.dirname(__file__))


def _frames(tb: TracebackType | None) -> list[Any]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def _where(err: BaseException, module: nn.Module) -> str:
    """``module 'x.y' (Class) at file.py:12 (code)`` for the frames of ``err``, or ''."""
    names = {id(m): name for name, m in module.named_modules()}
    frames = _frames(err.__traceback__)
    inner = None
    for frame in frames:
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names:
            inner = owner
    code = next(
        (f for f in reversed(frames) if not f.f_code.co_filename.startswith((_TORCH, _LMCKIT))),
        None,
    )
    parts = []
    if inner is not None and names[id(inner)]:
        parts.append(f"module {names[id(inner)]!r} ({type(inner).__name__})")
    if code is not None:
        line = linecache.getline(code.f_code.co_filename, code.f_lineno).strip()
        place = f"{os.path.basename(code.f_code.co_filename)}:{code.f_lineno}"
        parts.append(f"at {place} ({line[:100]})" if line else f"at {place}")
    return " ".join(parts)


def _first_line(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return f"{type(err).__name__}: {first[:300]}"


def describe_failure(
    err: BaseException,
    module: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    """One line saying where and why ``module`` did not trace on ``args``/``kwargs``
    (``err``: what ``torch.export`` raised), after running it once untraced (eval mode,
    no gradients) to tell a model that does not run on these inputs from one that does
    not trace."""
    try:
        with torch.no_grad():
            module(*args, **kwargs)
    except Exception as eager:  # the model's own error, whatever its type
        where = _where(eager, module)
        at = f" in {where}" if where else ""
        return (
            f"{type(module).__name__} does not run on these inputs{at}: {_first_line(eager)} "
            "(it fails without tracing too: its configuration or the inputs do not fit it)"
        )
    where = _where(err, module)
    return f"{where + ': ' if where else ''}{_first_line(err)}"
