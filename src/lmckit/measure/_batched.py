"""Many parameter sets of one module evaluated together: the points of a path or grid.

Every point of a path runs through the same module with
``torch.func.functional_call``. Point by point, that is one forward pass per point and
batch, each too small to fill a GPU. Batched, the points' parameters are stacked along
a new leading axis and ``torch.func.vmap`` runs them through the module at once: one
call per batch (or per chunk of points, when memory is short), each batch read and
moved to the device once for all points.

How it is run is a :class:`Batching` (what is computed never changes): ``auto``
batches on accelerators and goes point by point on the CPU, where a forward pass of a
few hundred examples is already compute-bound and ``vmap``'s grouped convolutions are
slower than plain ones (``BENCHMARKS.md``); ``batched`` batches wherever it can;
``loop`` never does. Batching falls back to the point-by-point loop, with a log
message naming the reason, when the module cannot run under ``vmap`` (in-place updates
of parameters or buffers, e.g. BatchNorm in train mode; ``.item()`` and other
data-dependent control flow on activations; random ops), when the points' parameters
differ in names or shapes, or when the stacked parameters do not fit the memory budget.
Both ways give the same sums up to float rounding (the tests hold them to 1e-5).

Point by point, a large point of a linear path (:class:`lmckit.measure._streamed.LinearPoint`) is
not built whole: each module's tensors are built as the forward pass reaches it
(:func:`lmckit.measure._streamed.streamed_call`), unless a module reads another's tensors, when
the points are built whole (said in a log message).

Loss and metric sums are taken per point and batch as :meth:`lmckit.training.Task.batch_totals`
does, in float64, and summed over processes (:mod:`lmckit.runtime._distributed`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from tqdm.auto import tqdm

from lmckit.measure._streamed import STREAM_BYTES, LinearPoint, streamed_call
from lmckit.runtime._distributed import shard, sum_over_ranks
from lmckit.symmetry._params import Params
from lmckit.training._task import Task

__all__ = ["CPU_MEMORY_BYTES", "Batching", "point_sums"]

log = logging.getLogger(__name__)

Batches = Iterable[tuple[Tensor, Tensor]]
Mode = Literal["auto", "batched", "loop"]
Precision = Literal["float32", "bfloat16", "float16"]

#: Bytes batched evaluation may use for stacked parameters and activations when the
#: device is a CPU (on CUDA: half of the free memory).
CPU_MEMORY_BYTES = 2**31
# A forward pass without gradients holds a few activations at a time: its input, its
# output, a residual; the largest module output times this bounds what one point needs.
_ACTIVATION_FACTOR = 4
# torch's own notice that an op runs under vmap by a loop over the points: correct,
# just not faster for that op (e.g. CPU flash attention); not the user's concern.
_SLOW_RULE = "There is a performance drop because we have not yet implemented the batching rule"


@dataclass(frozen=True)
class Batching:
    """How the points of a path or simplex grid are run (never what is computed).

    Attributes:
        mode: ``auto`` (batched on accelerators, point by point on the CPU),
            ``batched`` (wherever ``vmap`` can run the module; falls back otherwise) or
            ``loop`` (point by point).
        points_per_call: points per batched forward call; ``None``: as many as
            ``memory_bytes`` allows.
        memory_bytes: what batching may use for stacked parameters and activations;
            ``None``: :data:`CPU_MEMORY_BYTES` on the CPU, half the free memory on CUDA.
        precision: ``float32`` (default), or ``bfloat16`` / ``float16`` to run forward
            passes under ``torch.autocast`` (meant for GPUs; sums stay float64). On the
            CPU autocast does not reach ``vmap``'s batched products, so there mixed
            precision runs point by point.
        stream_bytes: a point of a linear path whose floating tensors take more bytes
            than this, run point by point, is built module by module as the forward
            pass reaches each (:mod:`lmckit.measure._streamed`; the numbers are the same): one
            module's part of the point in memory instead of all of it.
    """

    mode: Mode = "auto"
    points_per_call: int | None = None
    memory_bytes: int | None = None
    precision: Precision = "float32"
    stream_bytes: int = STREAM_BYTES

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "batched", "loop"):
            raise ValueError(f"mode must be 'auto', 'batched' or 'loop', got {self.mode!r}")
        if self.points_per_call is not None and self.points_per_call < 1:
            raise ValueError(f"points_per_call must be >= 1 or None, got {self.points_per_call}")
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise ValueError(f"memory_bytes must be >= 1 or None, got {self.memory_bytes}")
        if self.stream_bytes < 0:
            raise ValueError(f"stream_bytes must be >= 0, got {self.stream_bytes}")
        if self.precision not in ("float32", "bfloat16", "float16"):
            raise ValueError(
                f"precision must be 'float32', 'bfloat16' or 'float16', got {self.precision!r}"
            )


class _Fallback(Exception):
    """Batching cannot run here; the message says why."""


def _device(model: nn.Module, params: Mapping[str, Tensor]) -> torch.device:
    stored = params.a if isinstance(params, LinearPoint) else params  # nothing built
    for value in chain(stored.values(), model.parameters(), model.buffers()):
        return value.device
    return torch.device("cpu")


def _whole(params: Mapping[str, Tensor]) -> Params:
    """A point as a dict of built tensors (a :class:`LinearPoint` is built here)."""
    return params if isinstance(params, dict) else dict(params)


def _autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager:
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, precision))


def _sums(task: Task, outputs: object, y: Tensor) -> tuple[Tensor, Tensor]:
    # what Task.batch_totals sums, kept as tensors (vmap-able, no host sync per batch)
    loss = task.loss(outputs, y, reduction="sum")  # type: ignore[arg-type]
    metric = task.metric(outputs, y).sum()  # type: ignore[arg-type]
    return loss.double(), metric.double()


def _loop(
    model: nn.Module,
    count: int,
    point: Callable[[int], Mapping[str, Tensor]],
    batches: Callable[[], Batches],
    task: Task,
    precision: Precision,
    progress: bool,
) -> tuple[Tensor, int]:
    """``(count, 2)`` loss and metric sums point by point, and the units per point."""
    rows: list[Tensor] = []
    units = 0
    stream = True  # until a module turns out to read another's tensors
    for i in tqdm(range(count), desc="path", unit="point", disable=not progress, leave=False):
        params = point(i)
        if not stream:
            params = _whole(params)
        device = _device(model, params)
        total = torch.zeros(2, dtype=torch.float64, device=device)
        units = 0
        for x, y in shard(batches()):
            x, y = x.to(device), y.to(device)
            with _autocast(device, precision):
                if isinstance(params, LinearPoint):
                    try:
                        out = streamed_call(model, params, x)
                    except Exception as err:
                        if i > 0 or units > 0:  # it ran before: not the streaming
                            raise
                        log.info("building each point whole: streaming fails: %s", err)
                        stream, params = False, _whole(params)
                        out = functional_call(model, _whole(params), (x,))
                else:
                    out = functional_call(model, _whole(params), (x,))
                loss, metric = _sums(task, out, y)
            total += torch.stack([loss, metric])
            units += y.numel()
        rows.append(total.cpu())
        del params  # freed before the next point is built: one point in memory at a time
    return torch.stack(rows), units


def _stack(points: list[Params]) -> Params:
    first = points[0]
    for p in points[1:]:
        if p.keys() != first.keys() or any(
            p[k].shape != v.shape or p[k].dtype != v.dtype or p[k].device != v.device
            for k, v in first.items()
        ):
            raise _Fallback("the points' parameters differ in names, shapes, dtypes or devices")
    return {k: torch.stack([p[k] for p in points]) for k in first}


def _largest_output(model: nn.Module, run: Callable[[], object]) -> int:
    """Bytes of the largest tensor any submodule outputs while ``run`` runs."""
    largest = 0

    def size(value: object) -> int:
        if isinstance(value, Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, Mapping):
            value = list(value.values())
        if isinstance(value, list | tuple):
            return max((size(v) for v in value), default=0)
        return 0

    def hook(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal largest
        largest = max(largest, size(output))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return largest


def _budget(device: torch.device, batching: Batching) -> int:
    if batching.memory_bytes is not None:
        return batching.memory_bytes
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    return CPU_MEMORY_BYTES


def _batched(
    model: nn.Module,
    count: int,
    point: Callable[[int], Mapping[str, Tensor]],
    batches: Callable[[], Batches],
    task: Task,
    batching: Batching,
    progress: bool,
    made: list[Params],
) -> tuple[Tensor, int]:
    """Sums of all points through ``vmap``; raises :class:`_Fallback` where it cannot
    run (``made`` collects the points built, so the loop need not rebuild them)."""
    it = iter(shard(batches()))
    first = next(it, None)
    made.append(_whole(point(0)))
    device = _device(model, made[0])
    if batching.precision != "float32" and device.type == "cpu":
        # CPU autocast leaves matmul alone, and vmap runs linear layers as matmuls
        raise _Fallback("autocast does not reach vmap's batched products on the CPU")
    if first is None:  # this process has no batches: nothing to add
        return torch.zeros(count, 2, dtype=torch.float64), 0
    point_bytes = sum(v.numel() * v.element_size() for v in made[0].values())
    budget = _budget(device, batching)
    if 2 * count * point_bytes > budget:
        raise _Fallback(
            f"{count} points and their stacked copy ({2 * count * point_bytes:,} bytes) do "
            f"not fit the memory budget ({budget:,} bytes)"
        )
    x, y = first[0].to(device), first[1].to(device)
    probe: list[Tensor] = []

    def run_probe() -> None:
        with _autocast(device, batching.precision):
            probe.append(_sums(task, functional_call(model, made[0], (x,)), y)[0])

    act = _largest_output(model, run_probe)
    # the points and their stacked copy take 2 * count * point_bytes; activations the rest
    per_call = batching.points_per_call or (budget - 2 * count * point_bytes) // max(
        1, _ACTIVATION_FACTOR * act
    )
    per_call = min(count, per_call)
    if per_call < 2:
        raise _Fallback(f"one batch's activations ({act:,} bytes) leave room for one point")
    made.extend(_whole(point(i)) for i in range(1, count))
    stacked = _stack(made)

    def chunk_sums(x: Tensor, y: Tensor, start: int) -> tuple[Tensor, Tensor]:
        def one(params: Params) -> tuple[Tensor, Tensor]:
            return _sums(task, functional_call(model, params, (x,)), y)

        chunk = {k: v[start : start + per_call] for k, v in stacked.items()}
        with warnings.catch_warnings(), _autocast(device, batching.precision):
            warnings.filterwarnings("ignore", message=_SLOW_RULE)
            return vmap(one, randomness="error")(chunk)

    total = torch.zeros(count, 2, dtype=torch.float64, device=device)
    units = 0
    for step, (xb, yb) in enumerate(
        tqdm(chain([(x, y)], it), desc="path", unit="batch", disable=not progress, leave=False)
    ):
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        for start in range(0, count, per_call):
            try:
                loss, metric = chunk_sums(xb, yb, start)
            except Exception as err:  # what vmap cannot run: the loop can, or names the bug
                raise _Fallback(f"vmap cannot run the module: {type(err).__name__}: {err}") from err
            if step == 0 and start == 0:
                _check_probe(float(probe[0]), float(loss[0]), batching.precision)
            total[start : start + per_call] += torch.stack([loss, metric], dim=1)
        units += yb.numel()
    log.debug("evaluated %d points batched, %d per call", count, per_call)
    return total.cpu(), units


def _check_probe(plain: float, batched: float, precision: Precision) -> None:
    # the first point ran both ways on the first batch: a module whose batched run
    # differs from its plain one (beyond rounding) is run point by point instead
    rtol = 1e-3 if precision == "float32" else 5e-2
    if not math.isfinite(plain):  # NaN or inf both ways: reported by the caller
        if math.isfinite(batched):
            raise _Fallback(f"the batched loss {batched} is finite, the plain one {plain} not")
    elif not abs(batched - plain) <= rtol * max(1.0, abs(plain)):
        raise _Fallback(f"the batched loss {batched} differs from the plain one {plain}")


def point_sums(
    model: nn.Module,
    count: int,
    point: Callable[[int], Mapping[str, Tensor]],
    batches: Callable[[], Batches],
    *,
    task: Task,
    batching: Batching | None = None,
    progress: bool = False,
) -> tuple[Tensor, int]:
    """Loss and metric sums of ``count`` parameter sets over all the data.

    Runs ``model`` in eval mode without gradients (its mode is restored). Each point is
    built once, in order (``point(0)``, ``point(1)``, ...). With a process group
    (:mod:`lmckit.runtime._distributed`) each process evaluates its share of the batches and the
    sums are summed over processes: every process returns the totals of all the data.

    Args:
        model: module of the architecture.
        count: number of points.
        point: ``i -> params`` of point ``i``.
        batches: callable returning a fresh iterable of ``(x, y)`` batches.
        task: loss and metric.
        batching: how to run the points (default :class:`Batching`).
        progress: progress bar.

    Returns:
        ``(sums, units)``: ``sums`` ``(count, 2)`` float64, the loss and metric sums of
        each point; ``units`` the number of units (target elements) they are over.
    """
    batching = batching or Batching()
    was_training = model.training
    model.eval()
    made: list[Params] = []
    try:
        with torch.no_grad():
            sums, units = None, 0
            # auto: batched on accelerators only (see the module docstring)
            wanted = batching.mode == "batched" or (
                batching.mode == "auto" and _device(model, {}).type != "cpu"
            )
            if count > 1 and wanted:
                try:
                    sums, units = _batched(
                        model, count, point, batches, task, batching, progress, made
                    )
                except _Fallback as why:
                    level = logging.WARNING if batching.mode == "batched" else logging.INFO
                    log.log(level, "evaluating point by point: %s", why)
            if sums is None:
                built = made  # points the batched attempt built are not built again

                def get(i: int) -> Mapping[str, Tensor]:
                    return built[i] if i < len(built) else point(i)

                sums, units = _loop(model, count, get, batches, task, batching.precision, progress)
    finally:
        model.train(was_training)
    reduced = sum_over_ranks([sums, torch.tensor([float(units)], dtype=torch.float64)])
    return reduced[0], int(reduced[1].item())
