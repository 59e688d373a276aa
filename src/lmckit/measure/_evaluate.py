"""Loss and metric of parameter sets, and along paths between them.

Definitions (README, "Python"): on the path ``theta(t) = (1 - t) theta_a + t theta_b``,
the loss barrier is ``max_t [L(theta(t)) - ((1 - t) L_a + t L_b)]`` and the accuracy
barrier ``max_t [((1 - t) A_a + t A_b) - A(theta(t))]``. The loss and the metric come
from a :class:`lmckit.training._task.Task` (default: cross-entropy and accuracy); a metric where
lower is better (e.g. mean absolute error) has the barrier
``max_t [M(theta(t)) - ((1 - t) M_a + t M_b)]``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lmckit._arguments import check_points
from lmckit.measure._batched import Batching, point_sums
from lmckit.measure._batchfit import fitting_batches
from lmckit.measure._record import JsonRecord
from lmckit.measure._streamed import LinearPoint
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params, as_module, as_params, check_compatible
from lmckit.training._task import CLASSIFICATION, Task

__all__ = [
    "Batching",
    "Metrics",
    "PathResult",
    "evaluate",
    "evaluate_along",
    "evaluate_path",
    "linear_grid",
]

Batches = Iterable[tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class Metrics:
    """Mean loss and mean metric on some data.

    Attributes:
        loss: mean loss per unit (nats per example or token for cross-entropy).
        acc: mean of the task's metric: accuracy (fraction) for classification, else
            the metric named ``metric``.
        metric: the metric's name (``"acc"``: accuracy).
    """

    loss: float
    acc: float
    metric: str = "acc"


def evaluate(
    model: nn.Module,
    params: Mapping[str, Tensor],
    batches: Batches,
    *,
    task: Task = CLASSIFICATION,
) -> Metrics:
    """Mean loss and metric of ``model`` run with ``params`` (eval mode) over ``batches``.

    Means are over units (examples, or tokens of a language model), however batched.
    With a process group (:mod:`lmckit.runtime._distributed`) each process evaluates its share
    of ``batches`` and every process returns the figures of all of them.

    Args:
        model: the module.
        params: its weights (a state dict).
        batches: an iterable of ``(inputs, targets)`` pairs, e.g. ``[(x, y)]`` or a
            ``DataLoader``.
        task: loss and metric (default: cross-entropy and accuracy).

    Raises:
        TypeError: arguments of the wrong kind (a checkpoint for ``params``, one pair
            ``(x, y)`` for the list of pairs ``[(x, y)]``), named in one line.
    """
    model = as_module(model)
    params = as_params(params)
    _check_not_one_pair(batches)
    source = fitting_batches(model, lambda: batches)
    sums, units = point_sums(model, 1, lambda _: dict(params), source, task=task)
    return _metrics(sums[0], units, task)


def _check_not_one_pair(batches: object) -> None:
    if isinstance(batches, (tuple, list)) and len(batches) == 2:
        if all(isinstance(b, Tensor) for b in batches):
            raise TypeError(
                "batches must be an iterable of (inputs, targets) pairs; got one pair of "
                "tensors: pass [(x, y)]"
            )


def _batch_source(batches: object) -> Callable[[], Batches]:
    """``batches`` as a callable returning a fresh iterable of ``(x, y)`` batches, as every
    point of a path needs its own pass over the data.

    A callable is taken as is; a list of pairs, a ``DataLoader`` or any iterable that
    can be iterated again is wrapped. A one-shot iterator (a generator) and one pair
    ``(x, y)`` given for a list of pairs are refused in one line (``TypeError``).
    """
    if callable(batches):
        return batches
    _check_not_one_pair(batches)
    if isinstance(batches, Iterable) and not isinstance(batches, Iterator):
        return lambda: batches
    raise TypeError(
        "batches must be a function returning an iterable of (inputs, targets) pairs (e.g. "
        "lambda: loader), or an iterable that can be read again (a list of pairs, a "
        f"DataLoader); got {type(batches).__name__}, which each point would use up"
    )


def _metrics(sums: Tensor, units: int, task: Task) -> Metrics:
    if units == 0:
        raise ValueError("no data to evaluate on")
    return Metrics(float(sums[0]) / units, float(sums[1]) / units, task.metric_name)


def linear_grid(points: int = 11) -> list[float]:
    """``points`` evenly spaced values of ``t`` in ``[0, 1]``, both ends included."""
    if points < 2:
        raise ValueError(f"a path needs at least 2 points, got {points}")
    return [i / (points - 1) for i in range(points)]


@dataclass(frozen=True)
class PathResult(JsonRecord):
    """Loss and metric at points ``t`` of a path from model A (t=0) to B (t=1).

    JSON (:meth:`to_dict`): ``t``, ``loss``, ``acc``, ``barrier_loss``, ``barrier_acc``,
    ``midpoint_loss``, ``midpoint_acc`` (at ``t = 0.5``; ``null`` when the grid has no
    such point), ``meta``. With another metric than accuracy,
    ``NAME``, ``barrier_NAME`` and ``midpoint_NAME`` replace the ``acc`` keys and
    ``metric`` (``NAME``) and ``higher_is_better`` are added, e.g. ``mae`` and
    ``barrier_mae`` for :func:`lmckit.training.mse`.

    Attributes:
        t: path positions, increasing, including 0 and 1.
        loss: mean loss at each ``t``.
        acc: the metric at each ``t``: accuracy (fraction) for classification, else the
            metric named ``metric``.
        meta: free-form description (method, split, data...).
        metric: the metric's name (``"acc"``: accuracy).
        higher_is_better: the metric's direction (the metric barrier follows it).
    """

    record_name: ClassVar[str] = "path result"

    t: list[float]
    loss: list[float]
    acc: list[float]
    meta: dict[str, Any] = field(default_factory=dict)
    metric: str = "acc"
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        if not (len(self.t) == len(self.loss) == len(self.acc)) or len(self.t) < 2:
            raise ValueError("t, loss and acc must have the same length, at least 2")
        if self.t[0] != 0.0 or self.t[-1] != 1.0:
            raise ValueError("a path result must include both ends, t=0 and t=1")

    def _chord(self, values: Sequence[float]) -> list[float]:
        return [(1 - t) * values[0] + t * values[-1] for t in self.t]

    @property
    def barrier_loss(self) -> float:
        """``max_t [L(t) - ((1 - t) L(0) + t L(1))]``."""
        return max(v - c for v, c in zip(self.loss, self._chord(self.loss), strict=True))

    @property
    def barrier_acc(self) -> float:
        """``max_t [((1 - t) A(0) + t A(1)) - A(t)]`` (the sign flipped when lower is better)."""
        sign = 1.0 if self.higher_is_better else -1.0
        return max(sign * (c - v) for v, c in zip(self.acc, self._chord(self.acc), strict=True))

    def _mid_index(self) -> int | None:
        return next((i for i, t in enumerate(self.t) if abs(t - 0.5) < 1e-9), None)

    @property
    def has_midpoint(self) -> bool:
        """Whether ``t = 0.5`` is a point of the grid (an odd number of even points)."""
        return self._mid_index() is not None

    def _mid(self) -> int:
        index = self._mid_index()
        if index is None:
            raise ValueError(
                "this path has no point at t = 0.5 (an even grid of an even number of "
                "points has none; use an odd number): its midpoint was not measured"
            )
        return index

    @property
    def midpoint_loss(self) -> float:
        """Loss at ``t = 0.5``; ``ValueError`` when the grid has no such point."""
        return self.loss[self._mid()]

    @property
    def midpoint_acc(self) -> float:
        """The metric at ``t = 0.5``; ``ValueError`` when the grid has no such point."""
        return self.acc[self._mid()]

    @property
    def _default_metric(self) -> bool:
        return self.metric == "acc" and self.higher_is_better

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (keys in the class docstring)."""
        name = self.metric
        out: dict[str, Any] = {
            "t": list(self.t),
            "loss": list(self.loss),
            name: list(self.acc),
            "barrier_loss": self.barrier_loss,
            f"barrier_{name}": self.barrier_acc,
            # null when t = 0.5 is not on the grid: only what was measured is reported
            "midpoint_loss": self.midpoint_loss if self.has_midpoint else None,
            f"midpoint_{name}": self.midpoint_acc if self.has_midpoint else None,
            "meta": dict(self.meta),
        }
        if not self._default_metric:
            out |= {"metric": name, "higher_is_better": self.higher_is_better}
        return out

    def plot(
        self, path: str | os.PathLike[str], *, title: str | None = None, overwrite: bool = False
    ) -> Path:
        """Draw loss and the metric against ``t`` into the image ``path`` (PNG, PDF, SVG,
        ...; :func:`lmckit.measure.plot_paths`; an existing file is replaced if lmckit drew
        it, or with ``overwrite``); returns ``path``."""
        from lmckit.measure._plot import plot_paths

        name = str(self.meta.get("method", "A -> B"))
        return plot_paths({name: self}, path, title=title, overwrite=overwrite)

    @classmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> PathResult:
        metric = str(data.get("metric", "acc"))
        return cls(
            [float(v) for v in data["t"]],
            [float(v) for v in data["loss"]],
            [float(v) for v in data[metric]],
            dict(data.get("meta", {})),
            metric,
            bool(data.get("higher_is_better", True)),
        )


PointFn = Callable[[Params, float], Params]


def _path_grid(ts: Sequence[float] | None = None, points: int = 11) -> list[float]:
    """``ts`` checked to increase from 0 to 1 inclusive, or ``linear_grid(points)``."""
    grid = list(ts) if ts is not None else linear_grid(points)
    if (
        len(grid) < 2
        or grid[0] != 0.0
        or grid[-1] != 1.0
        or any(b <= a for a, b in zip(grid, grid[1:], strict=False))
    ):
        raise ValueError("ts must increase from 0 to 1 inclusive")
    return grid


def evaluate_along(
    model: nn.Module,
    point: Callable[[float], Mapping[str, Tensor]],
    batches: Callable[[], Batches] | Iterable[tuple[Tensor, Tensor]],
    *,
    ts: Sequence[float] | None = None,
    points: int = 11,
    prepare: PointFn | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: bool = False,
    task: Task = CLASSIFICATION,
    batching: Batching | None = None,
) -> PathResult:
    """Evaluate any path given as ``t -> theta(t)`` (a line, a curve) at ``ts``.

    One module serves every point: each ``theta(t)`` runs through it with
    ``torch.func.functional_call``, all points at once through ``torch.func.vmap``
    where ``batching`` says so and the module allows (:mod:`lmckit.measure._batched`; the
    numbers are the same either way). Each point is built once, in order of ``t``.
    With a process group the batches are split across processes
    (:mod:`lmckit.runtime._distributed`).

    Args:
        model: module of the architecture.
        point: ``theta(t)`` for ``t`` in ``[0, 1]``.
        batches: a callable returning a fresh iterable of ``(x, y)`` batches, or an
            iterable that can be read again (a list of pairs, a ``DataLoader``; a
            one-shot generator is refused).
        ts: path positions, increasing from 0 to 1 inclusive; default
            ``linear_grid(points)``.
        prepare: optional ``(theta_t, t) -> theta_t'`` applied at each point, e.g. a
            BatchNorm reset or REPAIR (see :mod:`lmckit.merging._merge`).
        meta: copied into the result.
        progress: progress bar.
        task: loss and metric (default: cross-entropy and accuracy).
        batching: how the points are run (default :class:`Batching`: batched on
            accelerators, point by point on the CPU; ``precision`` for mixed precision).

    Raises:
        FloatingPointError: the loss is not finite at some point.
        TypeError: arguments of the wrong kind, named in one line.
        DataMismatchError: batches the model cannot read (the first one is run through
            it once, its own weights; :mod:`lmckit.measure._batchfit`), token ids beyond its
            vocabulary, or targets that are not indices of its outputs.
    """
    model = as_module(model)
    precision = (batching or Batching()).precision
    source = fitting_batches(model, _batch_source(batches), precision=precision)
    grid = _path_grid(ts, check_points(points))

    def theta(i: int) -> Mapping[str, Tensor]:
        p = point(grid[i])
        return p if prepare is None else prepare(dict(p), grid[i])

    sums, units = point_sums(
        model, len(grid), theta, source, task=task, batching=batching, progress=progress
    )
    losses, values = [], []
    for t, row in zip(grid, sums, strict=True):
        m = _metrics(row, units, task)
        if not math.isfinite(m.loss):
            raise FloatingPointError(f"loss is not finite at t={t}")
        losses.append(m.loss)
        values.append(m.acc)
    return PathResult(
        grid, losses, values, dict(meta or {}), task.metric_name, task.higher_is_better
    )


def evaluate_path(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    batches: Callable[[], Batches] | Iterable[tuple[Tensor, Tensor]],
    *,
    ts: Sequence[float] | None = None,
    points: int = 11,
    prepare: PointFn | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: bool = False,
    task: Task = CLASSIFICATION,
    batching: Batching | None = None,
    dtype: torch.dtype | None = None,
) -> PathResult:
    """Evaluate the linear path ``(1 - t) theta_a + t theta_b`` between two parameter sets.

    Args:
        model: module of the architecture.
        params_a, params_b: endpoints (A at t=0, B at t=1).
        batches, ts, points, prepare, meta, progress, task, batching: as for
            :func:`evaluate_along`.
        dtype: floating dtype each point is built and evaluated in (default: the
            endpoints'): bfloat16 endpoints kept as stored and measured in float32 cost
            one float32 point at a time instead of two float32 copies. A point larger
            than ``batching.stream_bytes`` evaluated point by point (on the CPU) is not
            even built whole: each module's part is built as the forward pass reaches
            it.
    """
    model = as_module(model)
    check_compatible(params_a, params_b)

    def point(t: float) -> Mapping[str, Tensor]:
        lazy = LinearPoint(params_a, params_b, t, dtype)
        if prepare is None and lazy.nbytes() > (batching or Batching()).stream_bytes:
            return lazy  # built module by module as the forward pass reaches it
        return interpolate(params_a, params_b, t, dtype=dtype)

    return evaluate_along(
        model,
        point,
        batches,
        ts=ts,
        points=points,
        prepare=prepare,
        meta=meta,
        progress=progress,
        task=task,
        batching=batching,
    )
