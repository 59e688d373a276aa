"""Seeded, deterministic (on CPU) training of a module from a parameter set.

Optionally with early stopping: the loss on the dataset's validation split is measured
every epoch (or every ``eval_every`` steps), the parameters of the best measurement are
kept, and training stops after ``patience`` measurements without improvement.

The loss is the task's (:mod:`lmckit.training._task`; default cross-entropy, so classifiers and
language models train unchanged); any data with train (and optionally validation)
tensors will do (:class:`TrainData`), e.g. regression targets with :func:`lmckit.training.mse`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from lmckit.data import batches
from lmckit.measure._evaluate import evaluate
from lmckit.symmetry._params import Params, check_finite
from lmckit.training._task import CLASSIFICATION, Task

__all__ = ["TrainConfig", "TrainData", "TrainResult", "ValidationPoint", "fit"]

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings.

    Attributes:
        epochs: passes over the training split (at most).
        batch_size: examples per step.
        optimizer: ``sgd`` (with Nesterov momentum), ``adam`` or ``adamw``.
        lr: peak learning rate.
        weight_decay: L2 (sgd, adam) or decoupled (adamw) weight decay.
        momentum: SGD momentum.
        schedule: ``cosine`` (to zero, after warm-up) or ``constant``.
        warmup: fraction of steps with a linear warm-up.
        max_steps: stop after this many steps (the schedule spans them); ``None``: all epochs.
        grad_clip: clip the global gradient norm to this value; ``None``: no clipping.
        patience: early stopping: stop after this many validation measurements without a
            lower validation loss, and return the best parameters. Needs a validation split.
        eval_every: steps between validation measurements; ``None``: at the end of every
            epoch. Setting it (or ``patience``) turns validation on; without ``patience``
            training runs to the end and the best measured parameters are returned.
        eval_batch_size: examples per validation batch; ``None``: ``batch_size``.
        min_delta: a validation loss counts as better when lower than the best by more.
    """

    epochs: int = 10
    batch_size: int = 128
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9
    schedule: str = "cosine"
    warmup: float = 0.0
    max_steps: int | None = None
    grad_clip: float | None = None
    patience: int | None = None
    eval_every: int | None = None
    eval_batch_size: int | None = None
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if not self.weight_decay >= 0 or not math.isfinite(self.weight_decay):
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not self.momentum >= 0 or not math.isfinite(self.momentum):
            raise ValueError(f"momentum must be >= 0, got {self.momentum}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup}")
        for name in ("max_steps", "patience", "eval_every", "eval_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.grad_clip is not None and not 0 < self.grad_clip < math.inf:
            raise ValueError(f"grad_clip must be a positive number or None, got {self.grad_clip}")
        if self.min_delta < 0:
            raise ValueError(f"min_delta must be >= 0, got {self.min_delta}")

    @property
    def validates(self) -> bool:
        """Whether training measures the validation loss (``patience`` or ``eval_every``)."""
        return self.patience is not None or self.eval_every is not None


class TrainData(Protocol):
    """What training reads: :class:`lmckit.data.Dataset`, or any object with these members.

    ``x_train`` ``(N, ...)`` and ``y_train`` ``(N, ...)`` are batched along their first
    axis; ``split("val")`` is read only when the config validates.
    """

    @property
    def name(self) -> str: ...

    @property
    def x_train(self) -> Tensor: ...

    @property
    def y_train(self) -> Tensor: ...

    @property
    def has_val(self) -> bool: ...

    @property
    def splits(self) -> tuple[str, ...]: ...

    def split(self, which: str) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class ValidationPoint:
    """One validation measurement: after ``step`` optimiser steps, in ``epoch`` (1-based).

    ``loss`` and ``acc`` are the task's loss and metric (cross-entropy and accuracy by
    default) on the validation split.
    """

    step: int
    epoch: int
    loss: float
    acc: float


@dataclass(frozen=True)
class TrainResult:
    """What :func:`fit` returns.

    Attributes:
        params: the trained parameters; with validation, those of the best measurement.
        steps: optimiser steps taken.
        epochs: epochs begun (the last one may be partial).
        stopped_early: whether ``patience`` ended training before ``epochs``/``max_steps``.
        history: validation measurements in order (empty without validation).
        best: the measurement whose parameters were returned, or ``None``.
    """

    params: Params
    steps: int
    epochs: int
    stopped_early: bool = False
    history: list[ValidationPoint] = field(default_factory=list)
    best: ValidationPoint | None = None


def make_optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
    """The optimiser ``config`` names, over ``params`` (tensors or parameter groups)."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=config.lr,
            momentum=config.momentum,
            nesterov=True,
            weight_decay=config.weight_decay,
        )
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def lr_factor(config: TrainConfig, step: int, total: int) -> float:
    """Multiplier of ``config.lr`` at ``step`` of ``total``: linear warm-up, then cosine."""
    warm = int(config.warmup * total)
    if step < warm:
        return (step + 1) / warm
    if config.schedule == "constant":
        return 1.0
    progress = (step - warm) / max(1, total - warm)
    return 0.5 * (1 + math.cos(math.pi * progress))


def _validation_loss(
    work: nn.Module, data: TrainData, batch_size: int, device: torch.device, task: Task
) -> tuple[float, float]:
    """Mean loss and metric (per unit) on the validation split."""
    x, y = data.split("val")
    on_device = ((xb.to(device), yb.to(device)) for xb, yb in batches(x, y, batch_size))
    m = evaluate(work, work.state_dict(), on_device, task=task)
    return m.loss, m.acc


def _snapshot(work: nn.Module) -> Params:
    return {k: v.detach().to("cpu", copy=True) for k, v in work.state_dict().items()}


@dataclass
class _Validation:
    """The validation measurements of one run: history, best point and its parameters."""

    config: TrainConfig
    data: TrainData
    task: Task
    device: torch.device
    history: list[ValidationPoint] = field(default_factory=list)
    best: ValidationPoint | None = None
    best_params: Params | None = None
    stale: int = 0  # measurements since the last improvement

    def __post_init__(self) -> None:
        if self.config.validates and not self.data.has_val:
            raise ValueError(
                f"early stopping / validation needs a validation split; dataset "
                f"{self.data.name!r} has only {', '.join(self.data.splits)}"
            )

    def measure(self, work: nn.Module, step: int, epoch: int, bar: tqdm) -> bool:
        """Measure the validation loss, keep the best parameters, show both on ``bar``;
        ``True`` when the patience has run out."""
        batch = self.config.eval_batch_size or self.config.batch_size
        loss, acc = _validation_loss(work, self.data, batch, self.device, self.task)
        point = ValidationPoint(step=step, epoch=epoch + 1, loss=loss, acc=acc)
        self.history.append(point)
        if self.best is None or loss < self.best.loss - self.config.min_delta:
            self.best_params = None  # the old copy goes before the new one is made
            self.best, self.best_params, self.stale = point, _snapshot(work), 0
        else:
            self.stale += 1
        bar.set_postfix(epoch=epoch + 1, val_loss=f"{loss:.4f}", best=f"{self.best.loss:.4f}")
        return self.config.patience is not None and self.stale >= self.config.patience

    def measured_at(self, step: int) -> bool:
        return bool(self.history) and self.history[-1].step == step

    def result(self, work: nn.Module, steps: int, epochs: int, stopped_early: bool) -> TrainResult:
        """The run's result: the best validated parameters, else ``work``'s last ones."""
        params = self.best_params if self.best_params is not None else _snapshot(work)
        return TrainResult(params, steps, epochs, stopped_early, self.history, self.best)


def _total_steps(config: TrainConfig, examples: int) -> int:
    """Optimisation steps of the run: ``epochs`` passes, capped by ``max_steps``."""
    total = config.epochs * math.ceil(examples / config.batch_size)
    return total if config.max_steps is None else min(total, config.max_steps)


def _training_copy(model: nn.Module, params: Params, device: torch.device) -> nn.Module:
    """A private copy of ``model`` holding ``params`` on ``device``, in training mode."""
    work = copy.deepcopy(model)
    work.load_state_dict(params)
    work.to(device)
    work.train()
    return work


def _step(
    work: nn.Module,
    opt: torch.optim.Optimizer,
    config: TrainConfig,
    task: Task,
    batch: tuple[Tensor, Tensor],
    lr: float,
    where: str,
) -> float:
    """One optimisation step at rate ``lr``; its loss (``where`` names it if it diverged)."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss = task.loss(work(batch[0]), batch[1])
    if not torch.isfinite(loss):
        raise FloatingPointError(f"training diverged at {where}: loss {loss}")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip is not None:
        nn.utils.clip_grad_norm_(work.parameters(), config.grad_clip)
    opt.step()
    return loss.item()


def fit(
    model: nn.Module,
    params: Params,
    data: TrainData,
    config: TrainConfig | None = None,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    progress: bool = True,
    task: Task = CLASSIFICATION,
) -> TrainResult:
    """Train from ``params`` on ``data``'s training split, with optional early stopping.

    Neither ``model`` nor ``params`` is modified: training runs on a private copy.
    Data order and any dropout come from ``seed`` (the global RNG is restored).
    Language models work unchanged: logits ``(B, T, V)`` and targets ``(B, T)`` are
    flattened to ``B*T`` token predictions.

    Args:
        model: the module that ``params`` belong to.
        params: initial parameters.
        data: the dataset; validation (``config.validates``) needs its ``val`` split.
        config: optimisation and early-stopping settings.
        seed: data order and dropout.
        device: where to train (default CPU); returned parameters are on the CPU.
        progress: show a progress bar.
        task: the loss minimised (its mean over a batch's units) and the validation
            metric; default cross-entropy and accuracy.

    Returns:
        the parameters (the best validated ones when validating), steps, and history.
    """
    config = config or TrainConfig()
    check_finite(params, what="initial parameters")
    device = torch.device(device or "cpu")
    validation = _Validation(config, data, task, device)
    work = _training_copy(model, params, device)
    opt = make_optimizer(config, work.parameters())
    x, y = data.x_train, data.y_train
    total = _total_steps(config, len(x))
    generator = torch.Generator().manual_seed(seed)
    step = epoch = 0
    stopped_early = False
    bar = tqdm(total=total, desc="train", unit="step", disable=not progress, leave=False)
    # CUDA dropout draws from the device's generator: fork it too, so the caller's is kept.
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)
        try:
            for epoch in range(config.epochs):
                for xb, yb in batches(x, y, config.batch_size, shuffle=True, generator=generator):
                    lr = config.lr * lr_factor(config, step, total)
                    where = f"epoch {epoch + 1}, step {step}"
                    loss = _step(work, opt, config, task, (xb.to(device), yb.to(device)), lr, where)
                    step += 1
                    bar.update(1)
                    bar.set_postfix(epoch=epoch + 1, loss=f"{loss:.4f}")
                    if config.eval_every is not None and step % config.eval_every == 0:
                        stopped_early = validation.measure(work, step, epoch, bar)
                    if stopped_early or step >= total:
                        break
                if config.validates and config.eval_every is None and not stopped_early:
                    stopped_early = validation.measure(work, step, epoch, bar)
                if stopped_early or step >= total:
                    break
            if config.validates and not validation.measured_at(step):
                # the last steps were never measured (eval_every does not divide them)
                validation.measure(work, step, epoch, bar)
        finally:
            bar.close()
    # the optimiser's moments and the gradients go before the result is copied out:
    # they would otherwise raise the run's peak memory by that copy
    del opt
    work.zero_grad(set_to_none=True)
    # An early stop at the very last step is no early stop.
    return validation.result(work, step, epoch + 1, stopped_early and step < total)
