"""Curved paths between two parameter sets: Bezier curves and polygonal chains.

For endpoints ``theta_a`` (t=0), ``theta_b`` (t=1) and control points ``c_1..c_k``
(Garipov et al. 2018, "Loss Surfaces, Mode Connectivity, and Fast Ensembling of DNNs"):

- Bezier of degree ``n = k + 1`` with nodes ``p_0 = theta_a, p_i = c_i, p_n = theta_b``:
  ``theta(t) = sum_i C(n, i) t^i (1 - t)^(n - i) p_i``; with one control point the
  quadratic ``(1 - t)^2 theta_a + 2 t (1 - t) c + t^2 theta_b``.
- Polygonal chain through the same nodes, ``n`` equal segments in ``t``: for
  ``s = n t``, ``i = min(floor(s), n - 1)``, ``theta(t) = (1 - (s - i)) p_i + (s - i) p_(i+1)``.

The control points are trained to minimise the expected loss along the curve,
``E_{t ~ U(0,1)} L(theta(t))``, one ``t`` drawn per mini-batch, by running each
``theta(t)`` through the model's own module with ``torch.func.functional_call``: no
curve layers. A curve is evaluated into a :class:`lmckit.measure.PathResult`, whose
barriers compare ``L(theta(t))`` with the chord ``(1 - t) L_a + t L_b`` as for a line.
Endpoints may be aligned (apply a transform to ``theta_b`` first) or not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.func import functional_call
from tqdm.auto import tqdm

from lmckit.data import batches
from lmckit.measure._evaluate import PathResult, evaluate_along
from lmckit.merging._methods import check_t
from lmckit.runtime._distributed import any_rank
from lmckit.symmetry._params import Params, check_compatible, check_finite
from lmckit.training._task import CLASSIFICATION, Task
from lmckit.training._train import TrainConfig, TrainData, lr_factor, make_optimizer

__all__ = [
    "CURVE_KINDS",
    "Curve",
    "CurveLike",
    "curve_point",
    "evaluate_curve",
    "fit_curve",
    "linear_init",
]

CURVE_KINDS = ("bezier", "chain")

Batches = Iterable[tuple[Tensor, Tensor]]


def _check_kind(kind: str) -> None:
    if kind not in CURVE_KINDS:
        raise ValueError(f"unknown curve kind {kind!r}; choose from {CURVE_KINDS}")


def _node_weights(kind: str, n: int, t: float) -> list[float]:
    """Weights of the ``n + 1`` nodes at ``t`` (Bernstein basis or chain hat functions)."""
    if kind == "bezier":
        return [math.comb(n, i) * t**i * (1 - t) ** (n - i) for i in range(n + 1)]
    s = t * n
    i = min(int(math.floor(s)), n - 1)
    u = s - i
    weights = [0.0] * (n + 1)
    weights[i], weights[i + 1] = 1.0 - u, u
    return weights


def _combine(nodes: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> Params:
    # out-of-place sums so gradients flow into control points that require grad
    out: Params = {}
    for name, first in nodes[0].items():
        if not first.is_floating_point():
            out[name] = first
            continue
        terms = [w * node[name] for w, node in zip(weights, nodes, strict=True) if w != 0.0]
        out[name] = sum(terms[1:], terms[0]) if terms else torch.zeros_like(first)
    return out


def curve_point(
    kind: str,
    start: Mapping[str, Tensor],
    controls: Sequence[Mapping[str, Tensor]],
    end: Mapping[str, Tensor],
    t: float,
) -> Params:
    """``theta(t)`` of a Bezier curve or polygonal chain (formulas in the module docstring).

    Differentiable in the control points; integer tensors come from ``start``.
    """
    _check_kind(kind)
    check_t(t)
    nodes = [start, *controls, end]
    return _combine(nodes, _node_weights(kind, len(nodes) - 1, t))


@dataclass(frozen=True)
class Curve:
    """A curve from ``start`` (t=0) to ``end`` (t=1) through ``controls``.

    Attributes:
        kind: ``bezier`` or ``chain``.
        start, end: the endpoints.
        controls: control points (Bezier) or interior nodes (chain), each a full
            parameter set of the architecture.
        history: mean training loss per epoch, if trained.
        steps: optimiser steps taken, if trained.
    """

    kind: str
    start: Params
    controls: tuple[Params, ...]
    end: Params
    history: tuple[float, ...] = ()
    steps: int = 0

    def __post_init__(self) -> None:
        _check_kind(self.kind)
        if not self.controls:
            raise ValueError("a curve needs at least one control point")
        check_compatible(self.start, self.end)
        for c in self.controls:
            check_compatible(self.start, c)

    def point(self, t: float) -> Params:
        """``theta(t)``, detached."""
        with torch.no_grad():
            return curve_point(self.kind, self.start, self.controls, self.end, t)


def linear_init(start: Params, end: Params, bends: int = 1) -> tuple[Params, ...]:
    """Control points on the segment: ``c_i = theta_a + i / (bends + 1) (theta_b - theta_a)``.

    Both curve kinds then trace the straight line (Bezier control points evenly spaced on a
    segment reproduce it exactly, with the same parametrisation).
    """
    if bends < 1:
        raise ValueError(f"need at least one control point, got {bends}")
    check_compatible(start, end)
    out = []
    for i in range(1, bends + 1):
        s = i / (bends + 1)
        out.append(
            {
                k: (1 - s) * v + s * end[k] if v.is_floating_point() else v.clone()
                for k, v in start.items()
            }
        )
    return tuple(out)


def _control_points(
    model: nn.Module, start: Params, initial: Sequence[Params]
) -> tuple[list[Params], list[Tensor]]:
    """Copies of the initial control points whose trainable entries (the module's
    parameters; buffers stay fixed) require gradients, and those entries."""
    trainable = [n for n, _ in model.named_parameters()]
    missing = [n for n in trainable if n not in start]
    if missing:
        raise ValueError(f"params lack the model's parameters {missing}")
    controls, leaves = [], []
    for c in initial:
        check_compatible(start, c)
        point = {k: v.detach().clone() for k, v in c.items()}
        for n in trainable:
            point[n].requires_grad_(True)
            leaves.append(point[n])
        controls.append(point)
    return controls, leaves


def _descend(opt: torch.optim.Optimizer, loss: Tensor, step: int) -> None:
    """One optimiser step on ``loss``, refusing a loss that is not finite."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"curve training diverged at step {step}")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def fit_curve(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    data: TrainData,
    config: TrainConfig | None = None,
    *,
    kind: str = "bezier",
    bends: int = 1,
    init: Sequence[Params] | None = None,
    seed: int = 0,
    max_seconds: float | None = None,
    progress: bool = False,
    task: Task = CLASSIFICATION,
) -> Curve:
    """Train the control points to minimise ``E_{t ~ U(0,1)} L(theta(t))`` on the train split.

    Only the model's trainable parameters move (buffers such as BatchNorm statistics of
    the control points stay at their initial values; in train mode BatchNorm uses batch
    statistics). ``weight_decay`` applies to the control points only. Endpoints are fixed.

    Args:
        model: module of the architecture (not modified).
        params_a, params_b: the endpoints.
        data: training data.
        config: optimiser, epochs (at most ``max_steps`` steps), batch size (default Adam
            1e-3, 10 epochs, batch 128).
        kind: ``bezier`` or ``chain``.
        bends: control points (ignored when ``init`` is given).
        init: initial control points; default :func:`linear_init`.
        seed: data order and the ``t`` samples; the global RNG is restored.
        max_seconds: stop after this much wall time (the control points as they are
            then; ``Curve.steps`` says how far training went).
        progress: progress bar over steps.
        task: the loss minimised (default cross-entropy).
    """
    _check_kind(kind)
    check_compatible(params_a, params_b)
    check_finite(params_a, what="start")
    check_finite(params_b, what="end")
    config = config or TrainConfig(epochs=10, optimizer="adam", lr=1e-3)
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive or None, got {max_seconds}")
    start = {k: v.detach() for k, v in params_a.items()}
    end = {k: v.detach() for k, v in params_b.items()}
    initial = tuple(init) if init is not None else linear_init(params_a, params_b, bends)
    controls, leaves = _control_points(model, start, initial)
    opt = make_optimizer(config, leaves)
    steps_per_epoch = math.ceil(len(data.x_train) / config.batch_size)
    total = config.epochs * steps_per_epoch
    total = total if config.max_steps is None else min(total, config.max_steps)
    generator = torch.Generator().manual_seed(seed)
    t_generator = torch.Generator().manual_seed(seed + 1)
    history = []
    was_training = model.training
    model.train()
    step, began, out_of_time = 0, time.perf_counter(), False
    bar = tqdm(total=total, desc=f"fit {kind}", unit="step", disable=not progress, leave=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            for _epoch in range(config.epochs):
                if out_of_time:
                    break
                running, count = 0.0, 0
                for xb, yb in batches(
                    data.x_train, data.y_train, config.batch_size, shuffle=True, generator=generator
                ):
                    for group in opt.param_groups:
                        group["lr"] = config.lr * lr_factor(config, step, total)
                    t = float(torch.rand((), generator=t_generator))
                    theta = curve_point(kind, start, controls, end, t)
                    loss = task.loss(functional_call(model, theta, (xb,)), yb)
                    _descend(opt, loss, step)
                    running += float(loss.detach()) * len(yb)
                    count += len(yb)
                    step += 1
                    bar.update(1)
                    if step >= total or (
                        max_seconds is not None
                        and any_rank(time.perf_counter() - began > max_seconds)
                    ):
                        out_of_time = True  # or out of steps: no further epoch either
                        break
                history.append(running / max(count, 1))
        finally:
            bar.close()
            model.train(was_training)
    final = tuple({k: v.detach().clone() for k, v in c.items()} for c in controls)
    return Curve(kind, start, final, end, tuple(history), step)


class CurveLike(Protocol):
    """What evaluating, storing and drawing a trained path needs: a :class:`Curve`, or a
    band (:class:`lmckit.paths.Band`)."""

    @property
    def kind(self) -> str: ...

    @property
    def start(self) -> Params: ...

    @property
    def controls(self) -> tuple[Params, ...]: ...

    @property
    def end(self) -> Params: ...

    def point(self, t: float) -> Params: ...


def evaluate_curve(
    model: nn.Module,
    curve: CurveLike,
    batches_fn: Callable[[], Batches],
    *,
    ts: Sequence[float] | None = None,
    points: int = 11,
    prepare: Callable[[Params, float], Params] | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: bool = False,
    task: Task = CLASSIFICATION,
) -> PathResult:
    """Loss and metric at points of ``curve``: a :class:`PathResult` like a linear path's.

    Args:
        model: module of the architecture.
        curve: the curve.
        batches_fn: callable returning fresh ``(x, y)`` batches.
        ts: positions, increasing from 0 to 1 inclusive; default ``linear_grid(points)``.
        prepare: optional ``(theta_t, t) -> theta_t'`` (BatchNorm reset, calibration...).
        meta: copied into the result, with ``curve`` = the kind.
        task: loss and metric (default cross-entropy and accuracy).
    """
    return evaluate_along(
        model,
        curve.point,
        batches_fn,
        ts=ts,
        points=points,
        prepare=prepare,
        meta={"curve": curve.kind, "controls": len(curve.controls), **dict(meta or {})},
        progress=progress,
        task=task,
    )
