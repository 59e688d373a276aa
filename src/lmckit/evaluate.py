"""Loss and accuracy of parameter sets, and along paths between them.

Definitions (DESIGN.md): on the path ``theta(t) = (1 - t) theta_a + t theta_b``,
the loss barrier is ``max_t [L(theta(t)) - ((1 - t) L_a + t L_b)]`` and the accuracy
barrier ``max_t [((1 - t) A_a + t A_b) - A(theta(t))]``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call
from tqdm.auto import tqdm

from lmckit.params import Params, check_compatible, interpolate

__all__ = [
    "Metrics",
    "PathResult",
    "evaluate",
    "evaluate_path",
    "linear_grid",
]

Batches = Iterable[tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class Metrics:
    """Mean loss (nats per example or token) and accuracy (fraction) on some data."""

    loss: float
    acc: float


def _flat_logits(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    # language models: (batch, time, vocab) logits against (batch, time) targets
    if logits.ndim == 3:
        return logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
    return logits, y


def evaluate(model: nn.Module, params: Mapping[str, Tensor], batches: Batches) -> Metrics:
    """Mean cross-entropy and accuracy of ``model`` run with ``params`` (eval mode)."""
    was_training = model.training
    model.eval()
    total_loss = 0.0
    correct = 0
    count = 0
    try:
        with torch.no_grad():
            for x, y in batches:
                logits, target = _flat_logits(functional_call(model, dict(params), (x,)), y)
                total_loss += float(F.cross_entropy(logits, target, reduction="sum"))
                correct += int((logits.argmax(-1) == target).sum())
                count += target.numel()
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("no data to evaluate on")
    return Metrics(total_loss / count, correct / count)


def linear_grid(points: int = 11) -> list[float]:
    """``points`` evenly spaced values of ``t`` in ``[0, 1]``, both ends included."""
    if points < 2:
        raise ValueError(f"a path needs at least 2 points, got {points}")
    return [i / (points - 1) for i in range(points)]


@dataclass(frozen=True)
class PathResult:
    """Loss and accuracy at points ``t`` of a path from model A (t=0) to B (t=1).

    Attributes:
        t: path positions, increasing, including 0 and 1.
        loss: mean loss at each ``t``.
        acc: accuracy (fraction) at each ``t``.
        meta: free-form description (method, split, data...).
    """

    t: list[float]
    loss: list[float]
    acc: list[float]
    meta: dict[str, Any] = field(default_factory=dict)

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
        """``max_t [((1 - t) A(0) + t A(1)) - A(t)]``."""
        return max(c - v for v, c in zip(self.acc, self._chord(self.acc), strict=True))

    def _mid(self) -> int:
        return min(range(len(self.t)), key=lambda i: abs(self.t[i] - 0.5))

    @property
    def midpoint_loss(self) -> float:
        """Loss at the grid point nearest ``t = 0.5``."""
        return self.loss[self._mid()]

    @property
    def midpoint_acc(self) -> float:
        return self.acc[self._mid()]

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": list(self.t),
            "loss": list(self.loss),
            "acc": list(self.acc),
            "barrier_loss": self.barrier_loss,
            "barrier_acc": self.barrier_acc,
            "midpoint_loss": self.midpoint_loss,
            "midpoint_acc": self.midpoint_acc,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PathResult:
        try:
            return cls(
                [float(v) for v in data["t"]],
                [float(v) for v in data["loss"]],
                [float(v) for v in data["acc"]],
                dict(data.get("meta", {})),
            )
        except KeyError as err:
            raise ValueError(f"path result is missing {err}") from None
        except TypeError as err:
            # e.g. "t": null or "meta": 3 in a hand-edited JSON file
            raise ValueError(f"path result is malformed: {err}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def load(cls, path: str | Path) -> PathResult:
        return cls.from_dict(json.loads(Path(path).read_text()))


PointFn = Callable[[Params, float], Params]


def evaluate_path(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    batches: Callable[[], Batches],
    *,
    ts: Sequence[float] | None = None,
    points: int = 11,
    prepare: PointFn | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> PathResult:
    """Evaluate the linear path between two parameter sets.

    One module serves every point: each ``theta(t)`` runs through it with
    ``torch.func.functional_call``.

    Args:
        model: module of the architecture.
        params_a, params_b: endpoints (A at t=0, B at t=1).
        batches: a callable returning a fresh iterable of ``(x, y)`` batches.
        ts: path positions; default ``linear_grid(points)``.
        prepare: optional ``(theta_t, t) -> theta_t'`` applied at each point, e.g. a
            BatchNorm reset or REPAIR (see :mod:`lmckit.merge`).
        meta: copied into the result.
        progress: progress bar over points.
    """
    check_compatible(params_a, params_b)
    ts = list(ts) if ts is not None else linear_grid(points)
    if ts[0] != 0.0 or ts[-1] != 1.0 or any(b <= a for a, b in zip(ts, ts[1:], strict=False)):
        raise ValueError("ts must increase from 0 to 1 inclusive")
    losses, accs = [], []
    for t in tqdm(ts, desc="path", unit="point", disable=not progress, leave=False):
        theta = interpolate(params_a, params_b, t)
        if prepare is not None:
            theta = prepare(theta, t)
        m = evaluate(model, theta, batches())
        if not math.isfinite(m.loss):
            raise FloatingPointError(f"loss is not finite at t={t}")
        losses.append(m.loss)
        accs.append(m.acc)
    return PathResult(ts, losses, accs, dict(meta or {}))
