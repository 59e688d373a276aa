"""Seeded, deterministic (on CPU) training of a module from a parameter set."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from lmckit.data import Dataset, batches
from lmckit.params import Params, check_finite

__all__ = ["TrainConfig", "train"]

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings.

    Attributes:
        epochs: passes over the training split.
        batch_size: examples per step.
        optimizer: ``sgd`` (with Nesterov momentum), ``adam`` or ``adamw``.
        lr: peak learning rate.
        weight_decay: L2 (sgd, adam) or decoupled (adamw) weight decay.
        momentum: SGD momentum.
        schedule: ``cosine`` (to zero, after warm-up) or ``constant``.
        warmup: fraction of steps with a linear warm-up.
    """

    epochs: int = 10
    batch_size: int = 128
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9
    schedule: str = "cosine"
    warmup: float = 0.0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(f"invalid training config {self}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup}")


def _optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
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


def _lr_factor(config: TrainConfig, step: int, total: int) -> float:
    warm = int(config.warmup * total)
    if step < warm:
        return (step + 1) / warm
    if config.schedule == "constant":
        return 1.0
    progress = (step - warm) / max(1, total - warm)
    return 0.5 * (1 + math.cos(math.pi * progress))


def train(
    model: nn.Module,
    params: Params,
    data: Dataset,
    config: TrainConfig | None = None,
    *,
    seed: int = 0,
    progress: bool = True,
) -> Params:
    """Train from ``params`` on ``data``'s training split; return the new params.

    Neither ``model`` nor ``params`` is modified: training runs on a private copy.
    Data order and any dropout come from ``seed`` (the global RNG is restored).
    """
    config = config or TrainConfig()
    check_finite(params, what="initial parameters")
    work = copy.deepcopy(model)
    work.load_state_dict(params)
    work.train()
    opt = _optimizer(config, work.parameters())
    x, y = data.x_train, data.y_train
    steps_per_epoch = math.ceil(len(x) / config.batch_size)
    total = config.epochs * steps_per_epoch
    generator = torch.Generator().manual_seed(seed)
    step = 0
    bar = tqdm(total=total, desc="train", unit="step", disable=not progress, leave=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            for epoch in range(config.epochs):
                for xb, yb in batches(x, y, config.batch_size, shuffle=True, generator=generator):
                    for group in opt.param_groups:
                        group["lr"] = config.lr * _lr_factor(config, step, total)
                    logits = work(xb)
                    if logits.ndim == 3:
                        logits, yb = logits.reshape(-1, logits.shape[-1]), yb.reshape(-1)
                    loss = F.cross_entropy(logits, yb)
                    if not torch.isfinite(loss):
                        raise FloatingPointError(
                            f"training diverged at epoch {epoch + 1}, step {step}: loss {loss}"
                        )
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    step += 1
                    bar.update(1)
                    bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.4f}")
        finally:
            bar.close()
    return {k: v.detach().clone() for k, v in work.state_dict().items()}
