"""Measure models on data: one split, the linear path between two, a barrier table.

The rules every caller shares live here, so the command line, the experiments and
library users measure the same way:

* :func:`eval_batch_size`: examples per evaluation batch (500; for language models as
  many as keep the logits ``(batch, time, vocab)`` near :data:`LM_EVAL_LOGITS` floats);
* :func:`resolve_fix`: what ``fix="auto"`` means for a network (a BatchNorm reset where
  there is BatchNorm, else nothing), and which fixes a network admits;
* :class:`EvalSettings`: split, grid and fix of a path measurement, validated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmckit._errors import ParameterError
from lmckit.data import Dataset, batches
from lmckit.measure._evaluate import Metrics, PathResult, evaluate, evaluate_path, linear_grid
from lmckit.measure._table import Column, format_table, percent
from lmckit.merging._merge import has_batchnorm
from lmckit.merging._methods import path_prepare
from lmckit.symmetry._params import Params

__all__ = [
    "FIXES",
    "LM_EVAL_LOGITS",
    "MAX_PATH_POINTS",
    "MERGE_FIXES",
    "MERGE_METHOD_OF_FIX",
    "EvalSettings",
    "check_fix",
    "eval_batch_size",
    "evaluate_split",
    "measure_path",
    "path_table",
    "resolve_fix",
    "train_inputs",
]

#: The merge method (:mod:`lmckit.merging._methods`) that makes each point under a fix: the
#: fixes of a merged model.
MERGE_METHOD_OF_FIX = {"none": "interpolate", "reset_bn": "reset_bn", "repair": "repair"}
#: The fixes of a merged model (:func:`lmckit.workflow.merge_pair`).
MERGE_FIXES = tuple(MERGE_METHOD_OF_FIX)
#: The fixes of a path: those of a merged model, and ``auto`` (:func:`resolve_fix`).
FIXES = ("auto", *MERGE_FIXES)
#: Logit floats per evaluation batch of a language model (batch * time * vocab), ~256 MB.
LM_EVAL_LOGITS = 2**26
#: Most points on one path: each point is a full evaluation of the split.
MAX_PATH_POINTS = 10_001
_DEFAULT_BATCH = 500


def eval_batch_size(data: Dataset, requested: int | None = None) -> int:
    """Examples per evaluation batch: ``requested``, else 500 (fewer for language models).

    Language-model logits are ``(batch, time, vocab)``: the batch is chosen so that they
    hold about :data:`LM_EVAL_LOGITS` floats, whatever the block length and vocabulary.
    """
    if requested is not None:
        if requested < 1:
            raise ValueError(f"evaluation batch size must be >= 1, got {requested}")
        return requested
    if data.is_language:
        return max(1, LM_EVAL_LOGITS // (data.input_shape[0] * data.num_classes))
    return _DEFAULT_BATCH


def check_fix(fix: str, fixes: tuple[str, ...] = FIXES) -> None:
    """Refuse a fix that is not one of ``fixes`` (:data:`FIXES`, or :data:`MERGE_FIXES`
    for a merged model): the one check of a fix's name.

    Raises:
        ParameterError: naming the fixes there are.
    """
    if fix not in fixes:
        raise ParameterError(f"{{fix}} must be one of {', '.join(fixes)}, got {fix!r}", fix="fix")


def resolve_fix(model: nn.Module, fix: str) -> str:
    """The fix applied at each point of a path: ``auto`` resolved, the rest checked.

    Args:
        model: the network measured.
        fix: ``auto`` (``reset_bn`` for networks with BatchNorm, else ``none``), ``none``,
            ``reset_bn`` or ``repair``.

    Raises:
        ValueError: an unknown fix, or ``reset_bn`` for a network without BatchNorm.
    """
    check_fix(fix)
    if fix == "auto":
        return "reset_bn" if has_batchnorm(model) else "none"
    if fix == "reset_bn" and not has_batchnorm(model):
        raise ValueError(
            "fix 'reset_bn' needs a network with BatchNorm layers; use 'none' or 'repair'"
        )
    return fix


@dataclass(frozen=True)
class EvalSettings:
    """Which data a path is measured on and how merged points are fixed.

    Attributes:
        split: ``test`` (held out, the default) or ``train``.
        points: grid points on ``[0, 1]``, both ends included: odd, so that ``t = 0.5``
            is one of them, from 3 to :data:`MAX_PATH_POINTS` (with two the barrier is 0
            by definition).
        batch_size: evaluation batch size; ``None``: :func:`eval_batch_size`'s rule.
        fix: ``none``; ``reset_bn`` (recompute BatchNorm statistics at each point);
            ``repair`` (REPAIR at each point); ``auto`` = ``reset_bn`` for networks with
            BatchNorm, else ``none``.
        stat_batches: training batches used for BatchNorm reset, REPAIR and
            activation statistics.
        dtype: floating dtype every point of a path is evaluated in (default: the
            endpoints' own; see :func:`lmckit.measure.evaluate_path`).
    """

    split: str = "test"
    points: int = 11
    batch_size: int | None = None
    fix: str = "auto"
    stat_batches: int = 20
    dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {self.split!r}")
        check_fix(self.fix)
        if not 3 <= self.points <= MAX_PATH_POINTS:
            raise ValueError(
                f"points must be between 3 and {MAX_PATH_POINTS} (both ends are included, so "
                f"with 2 the barrier is 0 by definition), got {self.points}"
            )
        if self.points % 2 == 0:
            raise ValueError(
                f"points must be odd, so that t = 0.5 is a point of the path (its midpoint "
                f"is reported), got {self.points}; use {self.points + 1}"
            )
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {self.batch_size}")
        if self.stat_batches < 1:
            raise ValueError(f"stat_batches must be >= 1, got {self.stat_batches}")

    def batch_for(self, data: Dataset) -> int:
        """The evaluation batch size on ``data`` (``batch_size`` or the shared rule)."""
        return eval_batch_size(data, self.batch_size)


def train_inputs(data: Dataset, settings: EvalSettings) -> Callable[[], list[Tensor]]:
    """Callable returning the first ``stat_batches`` training input batches."""
    size = settings.batch_for(data)

    def inputs() -> list[Tensor]:
        return [
            x for x, _ in batches(data.x_train, data.y_train, size, limit=settings.stat_batches)
        ]

    return inputs


def evaluate_split(
    model: nn.Module,
    params: Params,
    data: Dataset,
    *,
    split: str = "test",
    batch_size: int | None = None,
) -> Metrics:
    """Mean loss and accuracy of ``params`` on one split, batched by the shared rule."""
    x, y = data.split(split)
    return evaluate(model, params, batches(x, y, eval_batch_size(data, batch_size)))


def measure_path(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    meta: dict | None = None,
    progress: bool = False,
) -> PathResult:
    """Evaluate the linear path on ``data`` with the settings' split and fix."""
    settings = settings or EvalSettings()
    x, y = data.split(settings.split)
    fix = resolve_fix(model, settings.fix)
    inputs = train_inputs(data, settings)
    prepare = path_prepare(MERGE_METHOD_OF_FIX[fix], model, params_a, params_b, inputs)
    size = settings.batch_for(data)
    return evaluate_path(
        model,
        params_a,
        params_b,
        lambda: batches(x, y, size),
        ts=linear_grid(settings.points),
        prepare=prepare,
        meta={"split": settings.split, "fix": fix, **(meta or {})},
        progress=progress,
        dtype=settings.dtype,
    )


#: the columns of :func:`path_table`
PATH_COLUMNS = (
    Column("method", "method", align="<"),
    Column("loss barrier", "barrier_loss", ".4f"),
    percent("acc barrier", "barrier_acc"),
    Column("mid loss", "midpoint_loss", ".4f"),
    percent("mid acc", "midpoint_acc"),
    Column("end losses", "end_losses"),
)


def path_table(results: Mapping[str, PathResult]) -> str:
    """Plain-text table of barriers and midpoints, one row per path (``-`` where a grid
    has no midpoint)."""
    rows = [
        {
            "method": name,
            "barrier_loss": r.barrier_loss,
            "barrier_acc": r.barrier_acc,
            "midpoint_loss": r.midpoint_loss if r.has_midpoint else None,
            "midpoint_acc": r.midpoint_acc if r.has_midpoint else None,
            "end_losses": f"{r.loss[0]:.4f}/{r.loss[-1]:.4f}",
        }
        for name, r in results.items()
    ]
    return format_table(rows, PATH_COLUMNS)
