"""Do inputs given as tensors fit a model? Checked on the first of them, in one line.

:mod:`lmckit.data._fit` compares a :class:`~lmckit.data.Dataset` with a model from what the
dataset says of itself (shapes, classes, vocabulary). Batches of ``(inputs, targets)``
(a list of pairs, a ``DataLoader``) and example inputs say nothing of themselves, so the
model is run once on them, with its own weights, in eval mode and without gradients
(:func:`probe_inputs`): inputs of the wrong shape or dtype (token ids for a model of
features, features of the wrong width) are named in one line instead of surfacing as
PyTorch's error from inside a layer. The embedding that reads token ids is found in that
run, and every later batch's ids are checked against its rows before the model sees them
(:func:`fitting_batches`). Labels are checked where they are scored
(:func:`lmckit.training._task.cross_entropy`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.data._fit import DataMismatchError

__all__ = ["TokenTable", "describe", "fitting_batches", "probe_inputs"]

Batches = Iterable[tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class TokenTable:
    """The embedding that reads a model's token ids: its name and number of rows."""

    name: str
    rows: int

    def check(self, ids: Tensor, what: str) -> None:
        """Refuse ids outside ``[0, rows)`` in one line (``DataMismatchError``)."""
        if ids.numel() == 0:
            return
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0 or high >= self.rows:
            bad = low if low < 0 else high
            raise DataMismatchError(
                f"{what}: token id {bad} is outside the model's vocabulary ({self.name} has "
                f"{self.rows} rows: ids 0 to {self.rows - 1})"
            )


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor {tuple(value.shape)} of {value.dtype}"
    return f"a {type(value).__name__}"


def _same_values(a: object, ids: Tensor) -> bool:
    # the ids themselves or a view of them (a model may reshape them first)
    return a is ids or (
        isinstance(a, Tensor) and a.data_ptr() == ids.data_ptr() and a.numel() == ids.numel()
    )


def describe(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """Inputs in a few words, for messages: ``"a tensor (2, 4) of torch.int64"``."""
    parts = [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
    return ", ".join(parts) or "no inputs"


def _integer(x: object) -> bool:
    return isinstance(x, Tensor) and not x.is_floating_point() and not x.is_complex()


def probe_inputs(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    what: str,
    shown: str | None = None,
    precision: str = "float32",
) -> TokenTable | None:
    """Run ``model`` once on ``args`` and ``kwargs`` (its own weights, eval mode, no
    gradients); return the embedding that read the first input when it is token ids.

    A model with a weight or buffer on the meta device (shapes only) is not run. ``shown``
    describes the inputs in messages (default: their kinds and shapes); ``precision``
    is the autocast dtype the inputs will be evaluated in (``"float32"``: none).

    Raises:
        DataMismatchError: the model cannot run on the inputs, or token ids lie outside
            the embedding that reads them; ``what`` names the inputs, e.g. ``"batches"``.
    """
    if any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
        return None
    first_param = next(iter(model.parameters()), None)
    device = first_param.device if first_param is not None else None
    args = [a.to(device) if isinstance(a, Tensor) and device else a for a in args]
    ids = args[0] if args and _integer(args[0]) else None
    found: list[TokenTable] = []

    def reads_ids(name: str, rows: int) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(_module: nn.Module, inputs: tuple[Any, ...]) -> None:
            if ids is not None and inputs and _same_values(inputs[0], ids) and not found:
                found.append(TokenTable(name, rows))
                found[0].check(ids, what)

        return hook

    handles = [
        m.register_forward_pre_hook(reads_ids(n, m.num_embeddings))
        for n, m in model.named_modules()
        if isinstance(m, nn.Embedding)
    ]
    was_training = model.training
    model.eval()
    kind = device.type if device is not None else "cpu"
    autocast = (
        torch.autocast(kind, dtype=getattr(torch, precision))
        if precision != "float32"
        else contextlib.nullcontext()
    )
    try:
        with torch.no_grad(), autocast:
            model(*args, **kwargs)
    except (RuntimeError, IndexError, TypeError, ValueError) as err:
        if isinstance(err, DataMismatchError):
            raise
        given = shown or describe(args, kwargs)
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise DataMismatchError(
            f"{what} ({given}) do not fit {type(model).__name__}: {type(err).__name__}: {reason}"
        ) from None
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return found[0] if found else None


def fitting_batches(
    model: nn.Module, source: Callable[[], Batches], *, precision: str = "float32"
) -> Callable[[], Batches]:
    """``source`` with its batches checked as they are read: each must be an ``(inputs,
    targets)`` pair; the first is probed (:func:`probe_inputs`, on its first example, in
    the evaluation's ``precision``), and every batch's token ids are checked against the
    embedding that reads them.

    Raises (when the batches are read):
        DataMismatchError: naming the batch's problem in one line.
        TypeError: a batch that is not an ``(inputs, targets)`` pair.
    """
    table: list[TokenTable | None] = []

    def checked() -> Iterator[tuple[Tensor, Tensor]]:
        for index, batch in enumerate(source()):
            if not isinstance(batch, (tuple, list)) or len(batch) != 2:
                size = f" of {len(batch)}" if isinstance(batch, (tuple, list)) else ""
                raise TypeError(
                    f"batches must yield (inputs, targets) pairs; batch {index} is "
                    f"{_describe(batch)}{size}"
                )
            x, y = batch
            if not table:
                first = x[:1] if isinstance(x, Tensor) else x
                table.append(probe_inputs(model, (first,), {}, what="the first batch's inputs",
                                          shown=_describe(x), precision=precision))  # fmt: skip
            if table[0] is not None and _integer(x):
                table[0].check(x, f"batch {index}'s inputs")
            yield x, y

    return checked
