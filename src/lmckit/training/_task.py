"""What a model is scored on: a loss to train and measure, and a metric to report.

A :class:`Task` is passed to training (:func:`lmckit.training.fit`), evaluation
(:func:`lmckit.measure.evaluate`, :func:`lmckit.measure.evaluate_path`), curve fitting
(:func:`lmckit.paths.fit_curve`), curvature (:mod:`lmckit.diagnostics._curvature`)
and greedy soups, so classification, language modelling and regression share one path
evaluation and one training loop. The default everywhere is :func:`classification`
(cross-entropy and accuracy).

Both the loss and the metric are computed per *unit*, one target element: an example
for a classifier, a token for a language model (logits ``(B, T, V)`` against targets
``(B, T)``), an output value for a regressor. Evaluation sums over units and divides
by their number, so the reported figures are means over the data however it is batched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "CLASSIFICATION",
    "LossFn",
    "MetricFn",
    "Task",
    "absolute_error",
    "accuracy",
    "check_labels",
    "classification",
    "cross_entropy",
    "mse",
    "squared_error",
]

# PathResult's JSON uses these keys itself; a metric may not take one of them as its name.
_RESERVED = frozenset({"t", "loss", "meta", "metric", "higher_is_better"})


class LossFn(Protocol):
    """``(outputs, targets, *, reduction) -> Tensor``, like ``torch.nn.functional`` losses.

    ``reduction="mean"`` returns the mean over units (what training minimises),
    ``"sum"`` the sum (what evaluation accumulates), ``"none"`` one value per unit.
    """

    def __call__(self, outputs: Tensor, targets: Tensor, *, reduction: str = "mean") -> Tensor: ...


class MetricFn(Protocol):
    """``(outputs, targets) -> Tensor`` of one value per unit (e.g. 1 for a correct class)."""

    def __call__(self, outputs: Tensor, targets: Tensor) -> Tensor: ...


def predictions(outputs: object) -> Tensor:
    """A model's predictions as one tensor: a tensor as is, a Hugging Face model output's
    ``logits``, or the first element of a tuple. Every built-in loss and metric takes
    its ``outputs`` through this, so any module's raw output can be passed."""
    if isinstance(outputs, Tensor):
        return outputs
    logits = getattr(outputs, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    if isinstance(outputs, tuple | list) and outputs and isinstance(outputs[0], Tensor):
        return outputs[0]
    raise TypeError(f"cannot read predictions from a model output of type {type(outputs).__name__}")


def _flatten(outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    # class scores on the last axis: (B, C) or, for language models, (B, T, V) -> (B*T, V)
    outputs = predictions(outputs)
    return outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1)


#: The target cross-entropy leaves out (PyTorch's ``ignore_index``: padding, masked tokens).
IGNORED_TARGET = -100


def check_labels(labels: Tensor, classes: int) -> None:
    """Refuse targets that are not class indices in ``[0, classes)`` (or
    :data:`IGNORED_TARGET`), in one line (``DataMismatchError``), before PyTorch's
    "Target 12 is out of bounds" from inside the loss."""
    from lmckit.data._fit import DataMismatchError  # here: datafit imports this module

    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise DataMismatchError(
            f"targets must be integer class indices (token ids for a language model), got "
            f"{labels.dtype}"
        )
    if labels.is_meta:
        return  # shapes without values (a memory count): nothing to compare
    kept = labels[labels != IGNORED_TARGET]
    if kept.numel() == 0:
        return
    low, high = (int(v) for v in torch.aminmax(kept))
    if low < 0 or high >= classes:
        raise DataMismatchError(
            f"targets: label {low if low < 0 else high} is not one of the model's {classes} "
            f"outputs (classes, or tokens of its vocabulary: 0 to {classes - 1})"
        )


def cross_entropy(outputs: Tensor, targets: Tensor, *, reduction: str = "mean") -> Tensor:
    """Cross-entropy of logits ``(..., C)`` against integer targets ``(...)``, per unit.

    Raises:
        DataMismatchError: a target that is not an index of the logits (nor -100).
    """
    logits, labels = _flatten(outputs, targets)
    check_labels(labels, logits.shape[-1])
    return F.cross_entropy(logits, labels, reduction=reduction)


def accuracy(outputs: Tensor, targets: Tensor) -> Tensor:
    """Whether the arg-max of each unit's logits is its target (bool, one per unit)."""
    logits, labels = _flatten(outputs, targets)
    return logits.argmax(-1) == labels


def _check_same_shape(outputs: Tensor, targets: Tensor) -> None:
    outputs = predictions(outputs)
    if outputs.shape != targets.shape:
        raise ValueError(
            f"regression outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)} "
            "differ in shape"
        )


def _reduce(values: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return values.mean()
    if reduction == "sum":
        return values.sum()
    if reduction == "none":
        return values
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def squared_error(outputs: Tensor, targets: Tensor, *, reduction: str = "mean") -> Tensor:
    """``(outputs - targets)^2`` per output element (same shapes), reduced."""
    _check_same_shape(outputs, targets)
    return _reduce((predictions(outputs) - targets) ** 2, reduction)


def absolute_error(outputs: Tensor, targets: Tensor) -> Tensor:
    """``|outputs - targets|`` per output element (same shapes)."""
    _check_same_shape(outputs, targets)
    return (predictions(outputs) - targets).abs()


@dataclass(frozen=True)
class Task:
    """A loss and a metric.

    Attributes:
        name: short description, e.g. ``"classification"``.
        loss: the loss (:class:`LossFn`): minimised in training, reported as ``loss``.
        metric: the metric (:class:`MetricFn`), one value per unit, reported as its mean.
        metric_name: the metric's key in results (``"acc"`` for accuracy; a
            :class:`~lmckit.measure.PathResult` of another metric writes ``NAME``,
            ``barrier_NAME`` and ``midpoint_NAME`` in its JSON).
        higher_is_better: direction of the metric; the metric barrier measures the
            shortfall from the chord in that direction.
    """

    name: str
    loss: LossFn
    metric: MetricFn
    metric_name: str = "acc"
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        if not self.metric_name.isidentifier() or self.metric_name in _RESERVED:
            raise ValueError(
                f"metric_name must be an identifier other than {sorted(_RESERVED)}, "
                f"got {self.metric_name!r}"
            )

    def batch_totals(self, outputs: Tensor, targets: Tensor) -> tuple[float, float, int]:
        """``(loss sum, metric sum, units)`` of one batch; a unit is one target element."""
        with torch.no_grad():
            loss = self.loss(outputs, targets, reduction="sum")
            metric = self.metric(outputs, targets).sum()
        return float(loss), float(metric), targets.numel()


def classification() -> Task:
    """Cross-entropy and accuracy (``acc``), per example or, for language models, per token."""
    return Task("classification", cross_entropy, accuracy)


def mse() -> Task:
    """Regression: mean squared error as the loss, mean absolute error (``mae``) as the metric.

    Outputs and targets must have the same shape (e.g. both ``(B,)``).
    """
    return Task("mse", squared_error, absolute_error, metric_name="mae", higher_is_better=False)


#: The default task of every function that takes one.
CLASSIFICATION = classification()
