"""Nudged elastic bands between two parameter sets, AutoNEB-style (Draxler et al. 2018).

A band is a polygonal chain of *pivots* ``theta_0 = theta_a, theta_1 .. theta_n,
theta_(n+1) = theta_b``. Each optimiser step moves every interior pivot ``i`` by the
nudged force of Henkelman & Jonsson (2000):

- the loss gradient perpendicular to the band, ``g_i - (g_i . tau_i) tau_i``, with
  ``g_i`` the gradient of the training loss at ``theta_i`` on one mini-batch (the same
  batch for every pivot of a step) and ``tau_i`` the unit tangent of their "improved
  tangent" (towards the neighbour of higher loss; a loss-weighted mix of both
  neighbours at a local extremum of the loss along the band);
- a spring along the band, ``k (|theta_(i+1) - theta_i| - |theta_i - theta_(i-1)|) tau_i``,
  which pulls each pivot towards even spacing (``k = inf``: instead of a spring the
  pivots are moved back to even spacing along the chain after every step, which is
  what Draxler et al. ran).

The pivots are trained in cycles (AutoNEB): after every cycle but the last, the loss is
measured at a few points inside each segment between neighbouring pivots, on a fixed
part of the training split; where a point's loss lies furthest above the chord
between its two pivots' losses (more than ``threshold`` of the band's loss range),
a new pivot is inserted there. The learning rate follows the config's schedule over
all cycles.

The band as a path: ``theta(t)`` is linear between pivots, with ``t`` the arc length
along the chain (Euclidean, in the trainable parameters) divided by its total, so the
pivots sit at the ``t`` of :attr:`Band.ts`. Tensors that are not trainable parameters
(BatchNorm statistics) are interpolated between the endpoints at each pivot's initial
position and never trained; measure a band with a BatchNorm reset at each point.

With a process group (:mod:`lmckit.runtime._distributed`) the pivots of each step are split
between the processes (pivot ``i`` on process ``i mod W``) and their gradients and
losses summed: every process takes the same step, and the band is the one a single
process computes, to the bit.

How it differs from Draxler et al. is said in ``docs/curves.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from tqdm.auto import tqdm

from lmckit.data import batches
from lmckit.merging._methods import check_t
from lmckit.paths._band_forces import nudged_force, redistribute_evenly
from lmckit.paths._band_growth import BandState, insert_pivots
from lmckit.paths._flat import FlatPacking
from lmckit.runtime._distributed import any_rank, sum_over_ranks, world
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params, check_compatible, check_finite
from lmckit.training._task import CLASSIFICATION, Task
from lmckit.training._train import TrainConfig, TrainData, lr_factor, make_optimizer

__all__ = ["Band", "BandConfig", "band_point", "fit_band"]

Batches = Iterable[tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class BandConfig:
    """How a band grows.

    Attributes:
        pivots: interior pivots to start with, evenly spaced on the straight line.
        cycles: training cycles; pivots are inserted after every cycle but the last.
        insert: most pivots inserted after a cycle (one per segment, highest first).
        spring: spring constant ``k`` (loss units per squared weight-space distance);
            ``math.inf`` (the default, Draxler et al.'s): no spring, the pivots are moved
            back to even spacing after every step.
        probes: points inside each segment whose loss decides where to insert.
        probe_examples: training examples (the first ones) the probes are measured on.
        threshold: a point's loss must lie above its segment's chord by more than
            this fraction of the band's loss range (highest minus lowest pivot loss on
            the probe examples) for a pivot to be inserted there.
    """

    pivots: int = 3
    cycles: int = 3
    insert: int = 2
    spring: float = math.inf
    probes: int = 5
    probe_examples: int = 2000
    threshold: float = 0.1

    def __post_init__(self) -> None:
        for name in ("pivots", "cycles", "probes", "probe_examples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.insert < 0:
            raise ValueError(f"insert must be >= 0, got {self.insert}")
        if not self.spring > 0 or math.isnan(self.spring):
            raise ValueError(f"spring must be a positive number or inf, got {self.spring}")
        if not 0 <= self.threshold < math.inf:
            raise ValueError(f"threshold must be >= 0, got {self.threshold}")


def _arc_positions(nodes: Sequence[Mapping[str, Tensor]], names: Sequence[str]) -> list[float]:
    """Cumulative Euclidean distance along the chain over ``names``, divided by its total."""
    lengths = [0.0]
    for p, q in zip(nodes, nodes[1:], strict=False):
        squared = sum(float((q[n].double() - p[n].double()).pow(2).sum()) for n in names)
        lengths.append(lengths[-1] + math.sqrt(squared))
    total = lengths[-1]
    if total == 0.0:
        raise ValueError("the band has zero length: its endpoints are the same point")
    return [length / total for length in lengths[:-1]] + [1.0]


def band_point(nodes: Sequence[Mapping[str, Tensor]], ts: Sequence[float], t: float) -> Params:
    """``theta(t)`` on the chain through ``nodes`` placed at ``ts`` (increasing, 0 to 1)."""
    check_t(t)
    i = max(j for j in range(len(ts) - 1) if ts[j] <= t)
    u = (t - ts[i]) / (ts[i + 1] - ts[i])
    return interpolate(nodes[i], nodes[i + 1], u)


@dataclass(frozen=True)
class Band:
    """A band from ``start`` (t=0) to ``end`` (t=1) through the pivots ``controls``.

    Attributes:
        start, end: the endpoints.
        controls: the interior pivots, in order along the band.
        names: the trainable parameters (arc length is measured over them).
        history: mean loss of the interior pivots on the training batches, per cycle.
        inserted: pivots inserted after each cycle.
        steps: optimiser steps taken.
    """

    start: Params
    controls: tuple[Params, ...]
    end: Params
    names: tuple[str, ...]
    history: tuple[float, ...] = ()
    inserted: tuple[int, ...] = ()
    steps: int = 0

    kind = "neb"

    def __post_init__(self) -> None:
        if not self.controls:
            raise ValueError("a band needs at least one pivot")
        for c in (*self.controls, self.end):
            check_compatible(self.start, c)

    @property
    def nodes(self) -> tuple[Params, ...]:
        """Every node: start, pivots, end."""
        return (self.start, *self.controls, self.end)

    @cached_property
    def ts(self) -> list[float]:
        """The ``t`` of every node (arc length along the chain over its total)."""
        return _arc_positions(self.nodes, self.names)

    def point(self, t: float) -> Params:
        """``theta(t)``: linear between the pivots on either side of ``t``."""
        return band_point(self.nodes, self.ts, t)


def _step_losses(
    model: nn.Module, state: BandState, xb: Tensor, yb: Tensor, task: Task
) -> tuple[Tensor, Tensor]:
    """Every node's loss on one batch and the interior nodes' gradients, each node on
    the process ``i mod W``, summed over the processes."""
    rank, size = world()
    n = state.coords.shape[0]
    losses = torch.zeros(n)
    grads = torch.zeros_like(state.coords)
    for i in range(n):
        if i % size != rank:
            continue
        leaf = state.coords[i].detach().requires_grad_(0 < i < n - 1)
        with torch.set_grad_enabled(leaf.requires_grad):
            out = functional_call(model, state.packing.unpack(leaf, state.bases[i]), (xb,))
            loss = task.loss(out, yb)
        if leaf.requires_grad:
            (grads[i],) = torch.autograd.grad(loss, leaf)
        losses[i] = loss.detach()
    # gradients first: each row then lies where a lone process's would (a reduction over
    # a row depends on its alignment in memory, and the band must not depend on W)
    grads, losses = sum_over_ranks([grads, losses])
    return losses, grads


def _initial_state(model: nn.Module, a: Params, b: Params, pivots: int) -> BandState:
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in a]
    if missing:
        raise ValueError(f"params lack the model's parameters {missing}")
    packing = FlatPacking(names, a)
    bases = [interpolate(a, b, i / (pivots + 1)) for i in range(pivots + 2)]
    bases[0], bases[-1] = dict(a), dict(b)
    coords = torch.stack([packing.pack(p) for p in bases])
    return BandState(coords, bases, packing)


def _to_band(state: BandState, history: list[float], inserted: list[int], steps: int) -> Band:
    nodes = [
        {k: v.detach().clone() for k, v in state.packing.unpack(row, base).items()}
        for row, base in zip(state.coords, state.bases, strict=True)
    ]
    return Band(
        state.bases[0],
        tuple(nodes[1:-1]),
        state.bases[-1],
        tuple(state.packing.names),
        tuple(history),
        tuple(inserted),
        steps,
    )


def _cycle_steps(config: TrainConfig, examples: int, cycles: int) -> tuple[int, list[int]]:
    """All the steps (``epochs`` passes, at most ``max_steps``) and each cycle's share."""
    total = config.epochs * math.ceil(examples / config.batch_size)
    total = total if config.max_steps is None else min(total, config.max_steps)
    return total, [total // cycles + (c < total % cycles) for c in range(cycles)]


def fit_band(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    data: TrainData,
    config: TrainConfig | None = None,
    band: BandConfig | None = None,
    *,
    seed: int = 0,
    max_seconds: float | None = None,
    progress: bool = False,
    task: Task = CLASSIFICATION,
) -> Band:
    """Train a nudged elastic band between two parameter sets (see the module docstring).

    Args:
        model: module of the architecture (not modified; run in train mode).
        params_a, params_b: the endpoints (fixed).
        data: training data; each step reads one mini-batch for all pivots.
        config: optimiser, learning rate and schedule, batch size; ``epochs`` passes
            over the training split in all (at most ``max_steps`` steps), split evenly
            between the cycles (default
            SGD with Nesterov momentum 0.9, lr 0.02, 10 epochs, batch 128, cosine).
        band: pivots, cycles, insertion and spring (default :class:`BandConfig`).
        seed: data order; the global RNG is restored.
        max_seconds: stop after this much wall time (the band as it is then).
        progress: progress bar over steps.
        task: the loss (default cross-entropy).
    """
    check_compatible(params_a, params_b)
    check_finite(params_a, what="start")
    check_finite(params_b, what="end")
    config = config or TrainConfig(epochs=10, optimizer="sgd", lr=0.02)
    band = band or BandConfig()
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive or None, got {max_seconds}")
    state = _initial_state(model, dict(params_a), dict(params_b), band.pivots)
    total, per_cycle = _cycle_steps(config, len(data.x_train), band.cycles)
    probe_x, probe_y = data.x_train[: band.probe_examples], data.y_train[: band.probe_examples]

    def probe() -> Batches:
        return batches(probe_x, probe_y, config.batch_size)

    trainer = _Trainer(
        model, config, band, task, total,
        _endless(data, config.batch_size, torch.Generator().manual_seed(seed)),
        None if max_seconds is None else time.perf_counter() + max_seconds,
        tqdm(total=total, desc="fit neb", unit="step", disable=not progress, leave=False),
    )  # fmt: skip
    history, inserted = [], []
    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for cycle, steps in enumerate(per_cycle):
                mean, out_of_time = trainer.cycle(state, steps)
                history.append(mean)
                if out_of_time or cycle == band.cycles - 1:
                    break
                if band.insert:
                    inserted.append(
                        insert_pivots(
                            model, state, probe, band.insert, band.probes, band.threshold, task
                        )
                    )
    finally:
        trainer.bar.close()
        model.train(was_training)
    return _to_band(state, history, inserted, trainer.step)


@dataclass
class _Trainer:
    """The steps of a band's training: optimiser settings, data, clock, progress."""

    model: nn.Module
    config: TrainConfig
    band: BandConfig
    task: Task
    total: int
    stream: Iterator[tuple[Tensor, Tensor]]
    deadline: float | None
    bar: Any
    step: int = 0

    def cycle(self, state: BandState, steps: int) -> tuple[float, bool]:
        """``steps`` optimiser steps (a fresh optimiser: the band may have grown); returns
        the mean interior loss and whether the time ran out."""
        opt = make_optimizer(self.config, [state.coords])
        running: list[float] = []
        for _ in range(steps):
            for group in opt.param_groups:
                group["lr"] = self.config.lr * lr_factor(self.config, self.step, self.total)
            xb, yb = next(self.stream)
            losses = _descend(
                self.model, state, opt, xb, yb, self.task, self.band.spring, self.step
            )
            running.append(float(losses[1:-1].mean()))
            self.step += 1
            self.bar.update(1)
            if self.deadline is not None and any_rank(time.perf_counter() > self.deadline):
                return sum(running) / len(running), True
        return sum(running) / max(len(running), 1), False


def _descend(
    model: nn.Module,
    state: BandState,
    opt: torch.optim.Optimizer,
    xb: Tensor,
    yb: Tensor,
    task: Task,
    spring: float,
    step: int,
) -> Tensor:
    """One step of every interior pivot along its nudged force; returns the nodes' losses."""
    losses, grads = _step_losses(model, state, xb, yb, task)
    if not bool(torch.isfinite(losses).all()):
        raise FloatingPointError(
            f"band training diverged at step {step} (a pivot's loss is not finite): lower lr"
        )
    coords = state.coords
    with torch.no_grad():
        coords.grad = nudged_force(coords, losses, grads, spring)
        ends = coords[0].clone(), coords[-1].clone()
        opt.step()
        coords[0], coords[-1] = ends  # weight decay must not move the endpoints
        if math.isinf(spring):
            redistribute_evenly(coords)
    return losses


def _endless(
    data: TrainData, size: int, generator: torch.Generator
) -> Iterator[tuple[Tensor, Tensor]]:
    """Shuffled training batches, epoch after epoch."""
    while True:
        yield from batches(data.x_train, data.y_train, size, shuffle=True, generator=generator)
