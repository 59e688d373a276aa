"""Curvature of the loss: the top Hessian eigenvalue by power iteration.

Hessian-vector products ``H v = grad_theta <grad L(theta), v>`` are computed
reverse-over-reverse (``torch.func.vjp`` of ``torch.func.grad``; ``H`` is symmetric, so
the vector-Jacobian product of the gradient is ``H v``) on ``Params``, so the Hessian is
never formed. (Forward-over-reverse would do too, but torch's forward-mode decompositions
go through the deprecated ``torch.jit.script``.) Power iteration ``v <- H v / ||H v||``
converges to the eigenvalue of largest magnitude, reported as the Rayleigh quotient
``v^T H v``; near a minimum that is the top (largest positive) eigenvalue.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vjp

from lmckit.symmetry._params import Params
from lmckit.training._task import CLASSIFICATION, Task

__all__ = [
    "HessianEigen",
    "hessian_vector_product",
    "loss_function",
    "path_top_eigenvalues",
    "top_hessian_eigenvalue",
]

LossFn = Callable[[Params], Tensor]


def hessian_vector_product(loss_fn: LossFn, params: Params, vector: Params) -> Params:
    """``H v`` with ``H`` the Hessian of the scalar ``loss_fn`` at ``params``."""
    if set(vector) != set(params):
        raise ValueError("the vector must have exactly the parameters' names")
    pullback = vjp(grad(loss_fn), params)[1]
    (hv,) = pullback(vector)
    return hv


def _dot(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> Tensor:
    return sum((a[k].double() * b[k].double()).sum() for k in a)  # type: ignore[return-value]


@dataclass(frozen=True)
class HessianEigen:
    """Result of power iteration.

    Attributes:
        value: Rayleigh quotient ``v^T H v`` of the final unit vector.
        vector: the unit eigenvector estimate, as ``Params``.
        iterations: Hessian-vector products used.
        converged: relative change of the estimate fell below the tolerance.
    """

    value: float
    vector: Params
    iterations: int
    converged: bool


def top_hessian_eigenvalue(
    loss_fn: LossFn,
    params: Params,
    *,
    iters: int = 50,
    tol: float = 1e-4,
    seed: int = 0,
) -> HessianEigen:
    """Largest-magnitude Hessian eigenvalue of ``loss_fn`` at ``params`` by power iteration.

    Args:
        loss_fn: ``Params -> scalar`` over exactly the keys of ``params``.
        params: the point (floating-point tensors).
        iters: maximum Hessian-vector products.
        tol: stop when ``|lam_k - lam_{k-1}| <= tol * |lam_k|``.
        seed: start vector ``N(0, I)`` from a private generator.
    """
    if iters < 1 or tol <= 0:
        raise ValueError(f"need iters >= 1 and tol > 0, got {iters}, {tol}")
    if not params or any(not v.is_floating_point() for v in params.values()):
        raise ValueError("params must be a non-empty set of floating-point tensors")
    point = {k: v.detach() for k, v in params.items()}
    gen = torch.Generator().manual_seed(seed)
    v = {k: torch.randn(p.shape, generator=gen, dtype=p.dtype) for k, p in point.items()}
    norm = math.sqrt(float(_dot(v, v)))
    v = {k: t / norm for k, t in v.items()}
    value = 0.0
    for step in range(1, iters + 1):
        hv = hessian_vector_product(loss_fn, point, v)
        new_value = float(_dot(v, hv))
        norm = math.sqrt(float(_dot(hv, hv)))
        if norm == 0.0:
            return HessianEigen(0.0, v, step, True)
        v = {k: t.detach() / norm for k, t in hv.items()}
        if step > 1 and abs(new_value - value) <= tol * abs(new_value):
            return HessianEigen(new_value, v, step, True)
        value = new_value
    return HessianEigen(value, v, iters, False)


def loss_function(
    model: nn.Module,
    params: Params,
    data: Sequence[tuple[Tensor, Tensor]],
    *,
    task: Task = CLASSIFICATION,
) -> tuple[LossFn, Params]:
    """The task's mean loss over fixed batches as a function of the trainable parameters.

    The mean is over every unit of every batch (default: cross-entropy per example or
    token).

    Buffers (BatchNorm statistics) are held fixed at their values in ``params``; the
    model runs in eval mode.

    Returns:
        ``(loss_fn, trainable)``: the function and the point's trainable parameters.
    """
    if not data:
        raise ValueError("need at least one batch")
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"params lack the model's parameters {missing}")
    trainable = {n: params[n].detach() for n in names}
    fixed = {k: v for k, v in params.items() if k not in trainable}
    count = sum(int(y.numel()) for _, y in data)
    model.eval()

    def loss_fn(theta: Params) -> Tensor:
        sums = (
            task.loss(functional_call(model, {**fixed, **theta}, (x,)), y, reduction="sum")
            for x, y in data
        )
        total = next(sums)  # data holds at least one batch
        for part in sums:
            total = total + part
        return total / count

    return loss_fn, trainable


def path_top_eigenvalues(
    model: nn.Module,
    point: Callable[[float], Params],
    data: Sequence[tuple[Tensor, Tensor]],
    ts: Sequence[float],
    *,
    iters: int = 30,
    tol: float = 1e-3,
    seed: int = 0,
    task: Task = CLASSIFICATION,
) -> list[float]:
    """Top Hessian eigenvalue of the task's loss on ``data`` at ``point(t)`` for each ``t``."""
    out = []
    for t in ts:
        loss_fn, trainable = loss_function(model, point(float(t)), data, task=task)
        out.append(
            top_hessian_eigenvalue(loss_fn, trainable, iters=iters, tol=tol, seed=seed).value
        )
    return out
