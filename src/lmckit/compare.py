"""Measure one pair of models under several alignment methods: the barrier table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from lmckit.align import activation_matching, weight_matching
from lmckit.align.result import AlignmentResult
from lmckit.data import Dataset, batches
from lmckit.evaluate import PathResult, evaluate_path, linear_grid
from lmckit.merge import has_batchnorm, repair_prepare, reset_prepare
from lmckit.params import Params
from lmckit.symmetry import SymmetrySpec, apply

__all__ = ["METHODS", "EvalSettings", "align_pair", "compare_alignments", "format_table"]

METHODS = ("naive", "weight_matching", "activation_matching")
FIXES = ("auto", "none", "reset_bn", "repair")


@dataclass(frozen=True)
class EvalSettings:
    """Which data a path is measured on and how merged points are fixed.

    Attributes:
        split: ``test`` (held out, the default) or ``train``.
        points: grid points on ``[0, 1]``.
        batch_size: evaluation batch size.
        fix: ``none``; ``reset_bn`` (recompute BatchNorm statistics at each point);
            ``repair`` (REPAIR at each point); ``auto`` = ``reset_bn`` for networks with
            BatchNorm, else ``none``.
        stat_batches: training batches used for BatchNorm reset, REPAIR and
            activation statistics.
    """

    split: str = "test"
    points: int = 11
    batch_size: int = 500
    fix: str = "auto"
    stat_batches: int = 20

    def __post_init__(self) -> None:
        if self.split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {self.split!r}")
        if self.fix not in FIXES:
            raise ValueError(f"fix must be one of {FIXES}, got {self.fix!r}")


def train_inputs(data: Dataset, settings: EvalSettings) -> Callable[[], list[Tensor]]:
    """Callable returning the first ``stat_batches`` training input batches."""

    def inputs() -> list[Tensor]:
        return [
            x
            for x, _ in batches(
                data.x_train, data.y_train, settings.batch_size, limit=settings.stat_batches
            )
        ]

    return inputs


def align_pair(
    method: str,
    model: nn.Module,
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    data: Dataset | None,
    settings: EvalSettings | None = None,
    *,
    seed: int = 0,
    progress: bool = False,
) -> AlignmentResult | None:
    """Run one alignment method (``naive`` returns ``None``: no transform)."""
    settings = settings or EvalSettings()
    if method == "naive":
        return None
    if method == "weight_matching":
        return weight_matching(spec, params_a, params_b, seed=seed, progress=progress)
    if method == "activation_matching":
        if data is None:
            raise ValueError("activation matching needs data")
        return activation_matching(
            model, spec, params_a, params_b, train_inputs(data, settings)(), progress=progress
        )
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


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
    fix = settings.fix
    if fix == "auto":
        fix = "reset_bn" if has_batchnorm(model) else "none"
    if fix == "reset_bn" and not has_batchnorm(model):
        raise ValueError(
            "fix 'reset_bn' needs a network with BatchNorm layers; use 'none' or 'repair'"
        )
    inputs = train_inputs(data, settings)
    prepare = None
    if fix == "reset_bn":
        prepare = reset_prepare(model, inputs)
    elif fix == "repair":
        prepare = repair_prepare(model, params_a, params_b, inputs)
    return evaluate_path(
        model,
        params_a,
        params_b,
        lambda: batches(x, y, settings.batch_size),
        ts=linear_grid(settings.points),
        prepare=prepare,
        meta={"split": settings.split, "fix": fix, **(meta or {})},
        progress=progress,
    )


def compare_alignments(
    model: nn.Module,
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    methods: Sequence[str] = METHODS,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, PathResult]:
    """Path results between A and B aligned to A by each method, keyed by method."""
    settings = settings or EvalSettings()
    out = {}
    for method in methods:
        result = align_pair(
            method, model, spec, params_a, params_b, data, settings, seed=seed, progress=progress
        )
        b = params_b if result is None else apply(spec, params_b, result.transform)
        meta = {"method": method}
        if result is not None:
            meta["align_seconds"] = round(result.seconds, 4)
            meta["align_sweeps"] = result.iterations
        out[method] = measure_path(model, params_a, b, data, settings, meta=meta, progress=progress)
    return out


def format_table(results: dict[str, PathResult]) -> str:
    """Plain-text table of barriers and midpoints, one row per path."""
    w = max(len("method"), *(len(name) for name in results)) + 2
    header = (
        f"{'method':<{w}}{'loss barrier':>14}{'acc barrier':>13}"
        f"{'mid loss':>10}{'mid acc':>9}{'end losses':>16}"
    )
    rows = [header, "-" * len(header)]
    for name, r in results.items():
        rows.append(
            f"{name:<{w}}{r.barrier_loss:>14.4f}{100 * r.barrier_acc:>12.2f}%"
            f"{r.midpoint_loss:>10.4f}{100 * r.midpoint_acc:>8.2f}%"
            f"{r.loss[0]:>8.4f}/{r.loss[-1]:.4f}"
        )
    return "\n".join(rows)
