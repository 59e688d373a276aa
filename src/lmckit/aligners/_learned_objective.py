"""Learned matching's objective, the loss of the interpolated model, and the descent on it.

Training steps minimise the loss of ``(1 - lambda) theta_a + lambda T(theta_b)`` with the
transform applied differentiably; early stopping watches the loss of the midpoint
``lambda = 1/2`` with the hard transform on a validation split (see
:mod:`lmckit.aligners._learned`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.aligners._dense import apply_dense, reader_matrices, straight_through
from lmckit.data import Dataset, batches
from lmckit.merging._merge import has_batchnorm, reset_batchnorm
from lmckit.runtime._distributed import rank_rows, shard, sum_gradients, sum_over_ranks
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import SymmetrySpec, Transform, apply

if TYPE_CHECKING:  # the config lives with the algorithm, which imports this module
    from lmckit.aligners._learned import LearnedMatchingConfig

__all__ = [
    "Descent",
    "Loss",
    "interpolated_loss",
    "midpoint_loss",
    "to_device",
    "validation_split",
]

#: ``loss(outputs, targets)``: a scalar to minimise, differentiable in ``outputs``.
Loss = Callable[[Tensor, Tensor], Tensor]


def validation_split(
    data: Dataset, fraction: float
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """``((x_train, y_train), (x_val, y_val))`` for early stopping.

    Uses the dataset's own validation split where it has one; otherwise the last
    ``fraction`` of the training split is held out (and not trained on).
    """
    if data.x_val is not None and data.y_val is not None and len(data.x_val) > 0:
        return (data.x_train, data.y_train), (data.x_val, data.y_val)
    n = data.x_train.shape[0]
    held = max(1, int(round(fraction * n)))
    if held >= n:
        raise ValueError(f"cannot hold out {held} of {n} training examples for validation")
    cut = n - held
    return (data.x_train[:cut], data.y_train[:cut]), (data.x_train[cut:], data.y_train[cut:])


def interpolated_loss(
    model: nn.Module,
    a: Params,
    moved: Params,
    buffers: set[str],
    lam: float,
    inputs: Tensor,
    targets: Tensor,
    loss: Loss,
) -> Tensor:
    """The loss of ``(1 - lam) a + lam moved`` on one batch, differentiable in ``moved``."""
    theta = {}
    for k, va in a.items():
        if not va.is_floating_point():
            theta[k] = va.clone()  # BatchNorm counts batches in place
        elif k in buffers:
            # running statistics: unused in train mode, and BatchNorm updates them in
            # place, so they must not be part of the graph
            theta[k] = ((1 - lam) * va + lam * moved[k]).detach().clone()
        else:
            theta[k] = (1 - lam) * va + lam * moved[k]
    return loss(functional_call(model, theta, (inputs,)), targets)


def midpoint_loss(
    model: nn.Module,
    spec: SymmetrySpec,
    a: Params,
    b: Params,
    transform: Transform,
    val: tuple[Tensor, Tensor],
    train_x: Tensor,
    *,
    batch_size: int,
    max_batches: int,
    device: torch.device,
    loss: Loss,
) -> float:
    """Mean validation loss of the midpoint of ``a`` and ``transform(b)`` (all ranks).

    BatchNorm models get their running statistics reset on up to 20 training batches
    first: interpolated running statistics are meaningless.
    """
    # the transform's elements live on the CPU (the solvers' side): apply there, then move
    mid = to_device(interpolate(a, apply(spec, b, transform), 0.5), device)
    if has_batchnorm(model):
        stop = min(train_x.shape[0], 20 * batch_size)
        inputs = [train_x[i : i + batch_size].to(device) for i in range(0, stop, batch_size)]
        mid = reset_batchnorm(model, mid, inputs)
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            # training-sized batches: a language model's logits are (batch, time, vocab)
            for x, y in shard(batches(val[0], val[1], batch_size, limit=max_batches)):
                x, y = x.to(device), y.to(device)
                total += float(loss(functional_call(model, mid, (x,)), y)) * len(x)
                count += len(x)
    finally:
        model.train(was_training)
    (sums,) = sum_over_ranks([torch.tensor([total, count], dtype=torch.float64)])
    return float(sums[0]) / float(sums[1])


def to_device(params: Params, device: torch.device) -> Params:
    """``params`` with every tensor on ``device``."""
    return {k: v.to(device) for k, v in params.items()}


class Descent:
    """The optimiser's state: one continuous matrix per learned space, AdamW on them,
    and A and the fixed part of B's transform on the device."""

    def __init__(
        self,
        spec: SymmetrySpec,
        model: nn.Module,
        params_a: Params,
        params_b: Params,
        base: Transform,
        fixed: Transform,
        names: Sequence[str],
        config: LearnedMatchingConfig,
        device: torch.device,
        loss: Loss,
    ) -> None:
        self.spec, self.model, self.names = spec, model, list(names)
        self.config, self.device, self.loss = config, device, loss
        self.a = to_device({k: v.detach() for k, v in params_a.items()}, device)
        self.b = to_device(apply(spec, {k: v.detach() for k, v in params_b.items()}, fixed), device)
        self.conts = {
            n: torch.nn.Parameter(spec[n].group.matrix(base[n]).float().to(device, copy=True))
            for n in names
        }
        self.opt = torch.optim.AdamW(
            self.conts.values(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.fixed = fixed
        self.buffers = {k for k, _ in model.named_buffers()}
        self.batchnorm = has_batchnorm(model)

    def hard_transform(self) -> Transform:
        """B's transform now: every learned matrix projected onto its group."""
        learned = {n: self.spec[n].group.project(self.conts[n].detach().cpu()) for n in self.names}
        return Transform(self.spec, learned).compose(self.fixed)

    def step(self, xb: Tensor, yb: Tensor, lam: float) -> float:
        """One AdamW step on the loss at ``lam`` for one batch; the loss (all ranks)."""
        mats = {n: relaxed(self.spec, n, self.conts[n], self.config) for n in self.names}
        self.opt.zero_grad(set_to_none=True)
        moved = apply_dense(self.spec, self.b, mats, reader_matrices(self.spec, mats))
        value = batch_gradient(
            self.model, self.a, moved, self.buffers, lam, xb, yb,
            self.loss, batchnorm=self.batchnorm, device=self.device,
        )  # fmt: skip
        (value,) = sum_gradients(list(self.conts.values()), [value], mean=self.batchnorm)
        if torch.isfinite(value):
            self.opt.step()
        return float(value)


def relaxed(spec: SymmetrySpec, name: str, cont: Tensor, config: LearnedMatchingConfig) -> Tensor:
    """The matrix a training step uses for space ``name``: projected (straight-through)
    or, for permutations with ``permutations="sinkhorn"``, a soft permutation."""
    return straight_through(
        spec[name].group,
        cont,
        relax=config.permutations == "sinkhorn",
        temperature=config.temperature,
        iters=config.sinkhorn_iters,
    )


def batch_gradient(
    model: nn.Module,
    a: Params,
    moved: Params,
    buffers: set[str],
    lam: float,
    xb: Tensor,
    yb: Tensor,
    loss: Loss,
    *,
    batchnorm: bool,
    device: torch.device,
) -> Tensor:
    """Backpropagate this process's share of one batch's interpolated loss; its value.

    Processes take their rows and sum gradients; with BatchNorm (whole-batch statistics)
    each runs the whole batch and the gradients are averaged.
    """
    share = slice(None) if batchnorm else rank_rows(len(xb))
    xs, ys = xb[share].to(device), yb[share].to(device)
    if not len(xs):
        return torch.zeros((), device=device)
    value = interpolated_loss(model, a, moved, buffers, lam, xs, ys, loss)
    if len(xs) < len(xb):  # this process's part of the batch mean
        value = value * (len(xs) / len(xb))
    value.backward()
    return value
