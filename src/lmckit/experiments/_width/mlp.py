"""``width-sweep`` and ``weight-decay``: permutation-free merging of wide MNIST MLPs.

Models: ``784 -> w -> w -> w -> 10`` ReLU MLPs, ``w = base_width * multiplier``. The
paper's 1x is 512 units; on a 2-core CPU we use ``BASE_WIDTH = 32`` (so our 16x = 512 =
the paper's 1x). The inverse temperature is fitted on the first 20 % of the test split
and every reported metric is on the remaining 80 %.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import Tensor

from lmckit.data import Dataset
from lmckit.diagnostics._width import (
    effective_rank,
    lewc_cosine,
    reciprocal_orthogonality_per_layer,
    weak_additivity_per_layer,
)
from lmckit.experiments._datasets import mnist_subset
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.experiments._width.common import (
    BASE_WIDTH,
    CALIBRATION_FRACTION,
    DEPTH,
    MULTIPLIERS,
    PAPER,
    WEIGHT_DECAYS,
    Batches,
    mlp_pair,
    naive_and_matched,
    split_test,
    sweep,
)
from lmckit.measure._evaluate import PathResult
from lmckit.measure._table import Column, format_table, percent
from lmckit.merging._calibration import evaluate_path_calibrated
from lmckit.training._train import TrainConfig

__all__ = ["FULL", "QUICK", "WidthSettings"]


@dataclass(frozen=True)
class WidthSettings:
    """Sizes of one run (full or quick).

    Attributes:
        base_width: units of the 1x model.
        multipliers: width multipliers swept.
        train: SGD settings of the endpoints.
        train_size: training images used (of 8000).
        test_size: test images used (of 2000); the first 20 % fit the temperature.
        points: path grid.
        probe_size: training images used by the diagnostics.
    """

    base_width: int
    multipliers: tuple[int, ...]
    train: TrainConfig
    train_size: int
    test_size: int
    points: int
    probe_size: int


FULL = WidthSettings(
    BASE_WIDTH,
    MULTIPLIERS,
    # decay alone shrinks a weight by exp(-sum_steps lr_t wd / (1 - momentum)) over training:
    # here 0.15 for wd 3e-3 and 0.94 for 1e-4 (10 epochs at lr 0.05 gave 0.62: too weak to
    # make the weights low-rank, so both decays merged alike)
    TrainConfig(epochs=20, batch_size=128, optimizer="sgd", lr=0.1, momentum=0.9),
    8000,
    2000,
    11,
    1000,
)
QUICK = WidthSettings(
    8,
    (1, 4),
    TrainConfig(epochs=2, batch_size=128, optimizer="sgd", lr=0.05, momentum=0.9),
    2000,
    500,
    5,
    200,
)


def _hidden_sites(prefix: str) -> list[str]:
    return [f"{prefix}.{i}" for i in range(DEPTH)]


def _reading_layers() -> list[str]:
    # every Linear layer that reads a hidden space (the first reads pixels, shared by both)
    return [f"layers.{i}" for i in range(1, DEPTH)] + ["head"]


def _mid_acc_barrier(path: PathResult) -> float:
    return 0.5 * (path.acc[0] + path.acc[-1]) - path.midpoint_acc


SWEEP_COLUMNS = (
    Column("wd", "weight_decay", ".0e"),
    Column("mult", lambda r: f"{r['multiplier']}x"),
    Column("width", "width"),
    Column("acc A/B %", lambda r: f"{100 * r['acc_a']:.2f}/{100 * r['acc_b']:.2f}"),
    percent("naive accB", "naive_acc_barrier"),
    percent("(mid)", "naive_mid_acc_barrier"),
    Column("naive lossB", "naive_loss_barrier", ".4f"),
    percent("WM accB", "wm_acc_barrier"),
    Column("WM lossB", "wm_loss_barrier", ".4f"),
    Column("RO ratio", "recip_orth", ".3f"),
)


def _setup(
    ctx: ExperimentContext, decays: tuple[float, ...]
) -> tuple[WidthSettings, Runner, Dataset, tuple[Batches, Batches], Tensor]:
    """The settings of ``ctx`` (quick or full), the runner over them and ``decays``, the
    MNIST subset, its calibration / evaluation halves of the test split, and the probe
    inputs (the first training images)."""
    settings = QUICK if ctx.quick else FULL
    run = Runner(ctx, {"settings": settings, "weight_decays": decays})
    data = mnist_subset(ctx, settings.train_size, settings.test_size)
    return settings, run, data, split_test(data), data.x_train[: settings.probe_size]


@register_experiment("width-sweep", paper=PAPER)
def width_sweep(ctx: ExperimentContext) -> ExperimentResult:
    """Permutation-free merging vs width and weight decay (MNIST MLPs, calibrated)."""
    settings, run, data, (fit, held), probe = _setup(ctx, WEIGHT_DECAYS)

    def measure(wd: float, mult: int) -> dict[str, Any]:
        width = settings.base_width * mult
        start = time.perf_counter()
        config = dataclasses.replace(settings.train, weight_decay=wd)
        model, a, b = mlp_pair(run, data, width, config)
        measured, paths, _ = naive_and_matched(
            model, a, b, fit, held, points=settings.points, seed=ctx.seed
        )
        ratio = reciprocal_orthogonality_per_layer(model, a, b, probe, _reading_layers())
        return {
            "weight_decay": wd,
            "multiplier": mult,
            "width": width,
            **measured,
            "naive_mid_acc_barrier": _mid_acc_barrier(paths["naive"]),
            "wm_mid_acc_barrier": _mid_acc_barrier(paths["weight_matching"]),
            "recip_orth": sum(ratio.values()) / len(ratio),
            "recip_orth_per_layer": ratio,
            "seconds": round(time.perf_counter() - start, 1),
        }

    rows, figures = sweep(
        run,
        settings.multipliers,
        measure,
        stage=lambda wd, mult: f"mlp-x{mult}-wd{wd:g}",
        figure=lambda wd, _mult, row: (
            f"paths_wd{wd:g}_width{row['width']}.png",
            f"MLP width {row['width']}, weight decay {wd:g} (calibrated)",
        ),
    )
    notes = (
        f"base width {settings.base_width} (paper's 1x = 512); {DEPTH} hidden layers; "
        f"SGD lr {settings.train.lr}, {settings.train.epochs} epochs; barriers over "
        f"{settings.points} points, each calibrated on {CALIBRATION_FRACTION:.0%} of the test "
        "split and measured on the rest; RO = mean over reading layers of "
        "(E||W_a z_b||/E||W_a z_a|| + E||W_b z_a||/E||W_b z_b||)/2"
    )
    return run.result(format_table(rows, SWEEP_COLUMNS), rows, figures, notes)


DECAYS = (1e-4, 1e-3, 3e-3)


@register_experiment("weight-decay", paper=PAPER)
def weight_decay(ctx: ExperimentContext) -> ExperimentResult:
    """LEWC, weak additivity, reciprocal orthogonality and rank vs weight decay (widest MLP)."""
    settings, run, data, (fit, held), probe = _setup(ctx, DECAYS)
    width = settings.base_width * settings.multipliers[-1]

    def measure(wd: float) -> dict[str, Any]:
        config = dataclasses.replace(settings.train, weight_decay=wd)
        model, a, b = mlp_pair(run, data, width, config)
        ranks = {
            f"layers.{i}": 0.5
            * (effective_rank(a[f"layers.{i}.weight"]) + effective_rank(b[f"layers.{i}.weight"]))
            for i in range(DEPTH)
        }
        path = evaluate_path_calibrated(model, a, b, fit, held, ts=[0.0, 0.5, 1.0])
        return {
            "weight_decay": wd,
            "width": width,
            "lewc": lewc_cosine(model, a, b, probe, [*_hidden_sites("acts"), "head"]),
            "weak_additivity": weak_additivity_per_layer(model, a, b, probe, _hidden_sites("acts")),
            "recip_orth": reciprocal_orthogonality_per_layer(model, a, b, probe, _reading_layers()),
            "effective_rank": ranks,
            "acc_a": path.acc[0],
            "acc_b": path.acc[-1],
            "merged_acc": path.acc[1],
            "merged_calibrated_loss": path.loss[1],
        }

    rows = [run.stage(f"decay-{wd:g}", partial(measure, wd)) for wd in DECAYS]

    def fmt(values: dict[str, float]) -> str:
        return " ".join(f"{v:.3f}" for v in values.values())

    lines = [
        f"MLP width {width} ({DEPTH} hidden layers), lambda = 1/2, per layer from input to output",
        "",
    ]
    for r in rows:
        lines += [
            f"weight decay {r['weight_decay']:.0e}: endpoints {100 * r['acc_a']:.2f}/"
            f"{100 * r['acc_b']:.2f} %, merged {100 * r['merged_acc']:.2f} % "
            f"(calibrated loss {r['merged_calibrated_loss']:.4f})",
            f"  LEWC cosine (acts.0..2, head):      {fmt(r['lewc'])}",
            f"  weak additivity (acts.0..2):        {fmt(r['weak_additivity'])}",
            f"  reciprocal orthogonality (l1,l2,h): {fmt(r['recip_orth'])}",
            "  effective rank (layers.0..2):       "
            + " ".join(f"{v:.1f}" for v in r["effective_rank"].values()),
        ]
    return run.result("\n".join(lines), rows, [], f"width {width}, probes on train images")
