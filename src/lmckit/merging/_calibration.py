"""Temperature calibration: one inverse temperature fitted on held-out data.

The calibrated model predicts ``softmax(beta * logits)``. ``beta`` minimises the mean
cross-entropy ``L(beta) = mean_i [logsumexp(beta z_i) - beta z_{i, y_i}]`` on a held-out
split (Guo et al. 2017). ``L`` is convex in ``beta`` (its second derivative is the
variance of ``z`` under ``softmax(beta z)``), so a bounded scalar search on ``log beta``
finds the optimum; accuracy is unchanged for ``beta > 0``. A merged model's logits are
shrunk by averaging, so its loss barrier is overstated without this (arXiv 2510.08023).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.measure._evaluate import Metrics, PathResult, linear_grid
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params, check_compatible

__all__ = [
    "CalibrationResult",
    "calibrate",
    "calibrated_metrics",
    "collect_logits",
    "evaluate_path_calibrated",
    "fit_inverse_temperature",
]

Batches = Iterable[tuple[Tensor, Tensor]]

# search range of log(beta): beta in [e^-8, e^8] covers any useful temperature
_LOG_BETA_BOUNDS = (-8.0, 8.0)


def collect_logits(
    model: nn.Module, params: Mapping[str, Tensor], batches: Batches
) -> tuple[Tensor, Tensor]:
    """All logits ``(N, classes)`` and targets ``(N,)`` of ``model`` with ``params`` (eval mode).

    Sequence outputs ``(batch, time, vocab)`` are flattened to one row per token.
    """
    was_training = model.training
    model.eval()
    logits, targets = [], []
    try:
        with torch.no_grad():
            for x, y in batches:
                out = functional_call(model, dict(params), (x,))
                logits.append(out.reshape(-1, out.shape[-1]))
                targets.append(y.reshape(-1))
    finally:
        model.train(was_training)
    if not logits:
        raise ValueError("no data to collect logits from")
    return torch.cat(logits), torch.cat(targets)


def calibrated_metrics(logits: Tensor, targets: Tensor, inverse_temperature: float) -> Metrics:
    """Cross-entropy of ``softmax(beta * logits)`` and accuracy (independent of ``beta > 0``)."""
    if inverse_temperature <= 0:
        raise ValueError(f"inverse temperature must be positive, got {inverse_temperature}")
    if logits.ndim != 2 or logits.shape[0] != targets.shape[0] or logits.shape[0] == 0:
        raise ValueError(
            f"need logits (N, classes) and targets (N,), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    z = logits.double()
    loss = float(F.cross_entropy(inverse_temperature * z, targets))
    acc = float((z.argmax(-1) == targets).double().mean())
    return Metrics(loss, acc)


def fit_inverse_temperature(logits: Tensor, targets: Tensor) -> float:
    """``argmin_beta mean CE(beta * logits, targets)`` over ``beta in [e^-8, e^8]``."""
    if logits.ndim != 2 or logits.shape[0] != targets.shape[0] or logits.shape[0] == 0:
        raise ValueError(
            f"need logits (N, classes) and targets (N,), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    z = logits.double()

    def objective(log_beta: float) -> float:
        return float(F.cross_entropy(math.exp(log_beta) * z, targets))

    res = minimize_scalar(
        objective, bounds=_LOG_BETA_BOUNDS, method="bounded", options={"xatol": 1e-6}
    )
    return math.exp(float(res.x))


@dataclass(frozen=True)
class CalibrationResult:
    """A fitted inverse temperature and the metrics on the evaluation split.

    Attributes:
        inverse_temperature: ``beta`` (the calibrated model predicts ``softmax(beta z)``).
        before: metrics with ``beta = 1``.
        after: metrics with the fitted ``beta``.
    """

    inverse_temperature: float
    before: Metrics
    after: Metrics


def calibrate(
    model: nn.Module, params: Params, fit_batches: Batches, eval_batches: Batches
) -> CalibrationResult:
    """Fit ``beta`` on ``fit_batches`` (held out), report metrics on ``eval_batches``."""
    beta = fit_inverse_temperature(*collect_logits(model, params, fit_batches))
    logits, targets = collect_logits(model, params, eval_batches)
    return CalibrationResult(
        beta, calibrated_metrics(logits, targets, 1.0), calibrated_metrics(logits, targets, beta)
    )


def evaluate_path_calibrated(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    fit_batches: Callable[[], Batches],
    eval_batches: Callable[[], Batches],
    *,
    ts: Sequence[float] | None = None,
    points: int = 11,
    prepare: Callable[[Params, float], Params] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> PathResult:
    """The linear path with every point temperature-calibrated.

    At each ``t`` the inverse temperature of ``theta(t)`` (after ``prepare``, e.g. a
    BatchNorm reset) is fitted on ``fit_batches`` and the calibrated loss and accuracy
    are measured on ``eval_batches``. The fitted values go to ``meta["inverse_temperature"]``.
    """
    check_compatible(params_a, params_b)
    ts = list(ts) if ts is not None else linear_grid(points)
    losses, accs, betas = [], [], []
    for t in ts:
        theta = interpolate(params_a, params_b, t)
        if prepare is not None:
            theta = prepare(theta, t)
        result = calibrate(model, theta, fit_batches(), eval_batches())
        if not math.isfinite(result.after.loss):
            raise FloatingPointError(f"calibrated loss is not finite at t={t}")
        losses.append(result.after.loss)
        accs.append(result.after.acc)
        betas.append(result.inverse_temperature)
    return PathResult(
        ts, losses, accs, {**dict(meta or {}), "calibrated": True, "inverse_temperature": betas}
    )
