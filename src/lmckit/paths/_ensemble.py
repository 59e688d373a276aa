"""Ensembles of parameter sets: the averaged outputs of several points of one module.

A curve ensemble (Garipov et al. 2018, "fast ensembling") takes ``K`` points of a trained
curve between two models and averages their outputs. Every member runs through the one
module with ``torch.func.functional_call``; for each batch the members' outputs are
combined and scored by the task's loss and metric:

- ``logits``: the mean of the members' logits (or, for a regression task, their
  predictions) is scored as one model's output;
- ``probabilities``: the mean of the members' softmax probabilities ``p``; the loss is
  the cross-entropy of ``log p`` (classification and language models only).

A group of one member is that member's own loss and metric either way. Several groups
of the same members (the ensemble, each endpoint, the pair of endpoints, ...) are
measured in one pass over the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call
from tqdm.auto import tqdm

from lmckit.measure._evaluate import Metrics
from lmckit.measure._record import JsonRecord
from lmckit.runtime._distributed import shard, sum_over_ranks
from lmckit.training._task import CLASSIFICATION, Task, predictions

__all__ = ["COMBINES", "EnsembleResult", "ensemble_metrics", "even_ts"]

#: How members' outputs are combined.
COMBINES = ("logits", "probabilities")

Batches = Iterable[tuple[Tensor, Tensor]]


def even_ts(points: int) -> list[float]:
    """``points`` evenly spaced positions on ``[0, 1]``, both ends included (``>= 2``)."""
    if points < 2:
        raise ValueError(f"an ensemble along a curve needs at least 2 points, got {points}")
    return [i / (points - 1) for i in range(points)]


def _member_output(
    model: nn.Module, params: Mapping[str, Tensor], x: Tensor, combine: str
) -> Tensor:
    out = predictions(functional_call(model, dict(params), (x,))).double()
    return torch.softmax(out, dim=-1) if combine == "probabilities" else out


def _check_groups(groups: Sequence[Sequence[int]], members: int) -> None:
    for group in groups:
        if not group or any(not 0 <= i < members for i in group):
            raise ValueError(f"group {list(group)} must name members 0..{members - 1}")


def ensemble_metrics(
    model: nn.Module,
    members: Sequence[Mapping[str, Tensor]],
    groups: Sequence[Sequence[int]],
    batches: Callable[[], Batches],
    *,
    combine: str = "logits",
    task: Task = CLASSIFICATION,
    progress: bool = False,
) -> list[Metrics]:
    """Loss and metric of each group of ``members`` as one averaged model.

    Args:
        model: module of the architecture (eval mode while measuring; restored).
        members: parameter sets of it.
        groups: lists of member indices; each is averaged and scored.
        batches: callable returning fresh ``(x, y)`` batches (split across processes
            under a process group, sums added over them).
        combine: ``logits`` or ``probabilities`` (module docstring).
        task: loss and metric.
        progress: progress bar over batches.

    Returns:
        One :class:`Metrics` per group, in order.
    """
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {', '.join(COMBINES)}, got {combine!r}")
    if combine == "probabilities" and task.name != CLASSIFICATION.name:
        raise ValueError(f"combine='probabilities' needs class scores; the task is {task.name}")
    _check_groups(groups, len(members))
    sums = torch.zeros(len(groups), 2, dtype=torch.float64)
    units = 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for x, y in tqdm(
                shard(batches()), desc="ensemble", unit="batch", disable=not progress, leave=False
            ):
                combined: list[Tensor | None] = [None] * len(groups)
                for m, params in enumerate(members):
                    out = _member_output(model, params, x, combine)
                    for g, group in enumerate(groups):
                        if m in group:
                            share = out / len(group)
                            current = combined[g]
                            combined[g] = share if current is None else current + share
                for g, mean in enumerate(combined):
                    assert mean is not None  # every group names a member
                    scores = mean.clamp_min(1e-300).log() if combine == "probabilities" else mean
                    sums[g, 0] += float(task.loss(scores, y, reduction="sum"))
                    sums[g, 1] += float(task.metric(scores, y).sum())
                units += y.numel()
    finally:
        model.train(was_training)
    summed, total = sum_over_ranks([sums, torch.tensor([float(units)], dtype=torch.float64)])
    count = int(total.item())
    if count == 0:
        raise ValueError("no data to evaluate on")
    measured = [Metrics(float(s[0]) / count, float(s[1]) / count, task.metric_name) for s in summed]
    for g, metrics in enumerate(measured):
        if not math.isfinite(metrics.loss):
            raise FloatingPointError(f"the loss of group {list(groups[g])} is not finite")
    return measured


def _metrics_dict(m: Metrics) -> dict[str, float]:
    return {"loss": m.loss, m.metric: m.acc}


@dataclass(frozen=True)
class EnsembleResult(JsonRecord):
    """A curve ensemble beside the models it is made from.

    JSON (:meth:`to_dict`): ``{"ensemble": {"acc", "loss"}, "endpoints": [{"acc",
    "loss"}, {...}], "pair_ensemble": {...}, "soup": {...}, "ts": [...], "meta"}``
    (another metric than accuracy under its own name).

    Attributes:
        ensemble: the averaged ``K`` points of the curve.
        endpoints: each endpoint alone (A, then B).
        pair_ensemble: A and B averaged (the classical ensemble of the two).
        soup: the uniform soup, one model with A's and B's averaged weights.
        ts: the ``K`` positions on the curve.
        meta: free-form description.
    """

    record_name: ClassVar[str] = "ensemble result"

    ensemble: Metrics
    endpoints: list[Metrics]
    pair_ensemble: Metrics
    soup: Metrics
    ts: list[float]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ensemble": _metrics_dict(self.ensemble),
            "endpoints": [_metrics_dict(m) for m in self.endpoints],
            "pair_ensemble": _metrics_dict(self.pair_ensemble),
            "soup": _metrics_dict(self.soup),
            "ts": list(self.ts),
            "meta": dict(self.meta),
        }

    @classmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> EnsembleResult:
        def metrics(d: Mapping[str, Any]) -> Metrics:
            name = next(k for k in d if k != "loss")
            return Metrics(float(d["loss"]), float(d[name]), name)

        return cls(
            metrics(data["ensemble"]),
            [metrics(d) for d in data["endpoints"]],
            metrics(data["pair_ensemble"]),
            metrics(data["soup"]),
            [float(t) for t in data["ts"]],
            dict(data.get("meta", {})),
        )
