"""``width-sweep-vgg`` / ``width-sweep-resnet20``: the width sweep for BatchNorm CNNs.

Permutation-free vs weight-matched merging of a 3-conv VGG-style net and ResNet20 on
MNIST subsets, BatchNorm statistics reset at every path point, every point
temperature-calibrated (as in :mod:`.mlp`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmckit.data import Dataset
from lmckit.experiments._datasets import mnist_subset
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.experiments._width.common import (
    CALIBRATION_FRACTION,
    PAPER,
    WEIGHT_DECAYS,
    Batches,
    naive_and_matched,
    split_test,
    sweep,
)
from lmckit.measure._table import Column, format_table, percent
from lmckit.merging._calibration import calibrate
from lmckit.merging._merge import reset_prepare
from lmckit.models import create_model
from lmckit.symmetry._average import interpolate
from lmckit.training._train import TrainConfig

__all__ = ["CNN_SWEEPS", "VGG_LAYOUT", "CNNSweep"]

#: VGG-style layout of the CNN sweep at 1x: three 3x3 convolutions, each followed by a
#: 2x2 max-pool (28 -> 14 -> 7 -> 3), then global average pooling. VGG11's own layout
#: at 0.5x already costs 1.8x this layout's 1x per step: too slow for a CPU width sweep.
VGG_LAYOUT = (32, "M", 64, "M", 128, "M")
#: training images used for each BatchNorm reset (in batches of ``_STAT_BATCH``).
_STAT_BATCH = 250


@dataclass(frozen=True)
class CNNSweep:
    """One CNN width sweep (full or quick).

    Attributes:
        model: zoo name (``vgg`` or ``resnet20``), always with ``norm="batch"``.
        multipliers: ``width_mult`` values swept (floats for VGG, ints for ResNet20).
        train: SGD settings of the endpoints (weight decay is swept on top).
        train_size: training images used (of 8000).
        test_size: test images used (of 2000); the first 20 % fit the temperature.
        stat_size: training images whose statistics reset BatchNorm at each path point.
        points: path grid.
    """

    model: str
    multipliers: tuple[float, ...]
    train: TrainConfig
    train_size: int
    test_size: int
    stat_size: int
    points: int

    def model_kwargs(self, multiplier: float) -> dict:
        """``create_model`` arguments for MNIST at ``width_mult = multiplier``."""
        if self.model == "vgg":
            return {
                "in_channels": 1,
                "num_classes": 10,
                "image_size": 28,
                "widths": VGG_LAYOUT,
                "width_mult": float(multiplier),
                "norm": "batch",
            }
        if self.model == "resnet20":
            return {
                "in_channels": 1,
                "num_classes": 10,
                "width_mult": int(multiplier),
                "norm": "batch",
            }
        raise ValueError(f"no CNN sweep for model {self.model!r}; choose vgg or resnet20")


# decay's effect is small at this step count: exp(-sum_t lr_t wd / (1 - momentum)) is
# 0.93 for wd 3e-3 and 0.998 for 1e-4 over the VGG run's 96 steps (cosine, peak lr 0.05);
# with BatchNorm the conv weights are scale-invariant, so decay acts through the
# effective learning rate. A 10 % warm-up: without it, lr 0.1 left the 2x VGG and the
# ResNets undertrained (85-90 %) in a few dozen steps (docs/experiments/core.md saw the same).
_CNN_TRAIN = TrainConfig(
    epochs=3, batch_size=64, optimizer="sgd", lr=0.05, momentum=0.9, warmup=0.1
)
_RESNET_TRAIN = TrainConfig(
    epochs=4, batch_size=64, optimizer="sgd", lr=0.05, momentum=0.9, warmup=0.1
)
_CNN_QUICK_TRAIN = TrainConfig(epochs=2, batch_size=64, optimizer="sgd", lr=0.1, momentum=0.9)
CNN_SWEEPS: dict[str, tuple[CNNSweep, CNNSweep]] = {
    # (full, quick)
    "vgg": (
        CNNSweep("vgg", (0.25, 0.5, 1.0, 2.0), _CNN_TRAIN, 2000, 1000, 500, 7),
        CNNSweep("vgg", (0.125, 0.5), _CNN_QUICK_TRAIN, 1024, 500, 256, 3),
    ),
    "resnet20": (
        CNNSweep("resnet20", (1, 2), _RESNET_TRAIN, 1000, 500, 250, 5),
        CNNSweep("resnet20", (1,), _CNN_QUICK_TRAIN, 256, 250, 250, 3),
    ),
}


def _width_label(model: nn.Module) -> str:
    """Channels of every stage / conv, e.g. ``16-32-64``."""
    widths = getattr(model, "widths", None) or [site[-1] for site in model.conv_sites]
    return "-".join(str(w) for w in widths)


COLUMNS = (
    Column("wd", "weight_decay", ".0e"),
    Column("mult", lambda r: f"{r['multiplier']}x"),
    Column("channels", "channels"),
    Column("acc A/B %", lambda r: f"{100 * r['acc_a']:.2f}/{100 * r['acc_b']:.2f}"),
    percent("naive accB", "naive_acc_barrier"),
    Column("lossB", "naive_loss_barrier", ".4f"),
    percent("mid", "naive_mid_acc"),
    percent("no reset", "naive_mid_acc_no_reset"),
    percent("WM accB", "wm_acc_barrier"),
    Column("WM lossB", "wm_loss_barrier", ".4f"),
)


def _cnn_width_sweep(ctx: ExperimentContext, name: str) -> ExperimentResult:
    """Permutation-free vs weight-matched merging of BatchNorm CNNs vs width and decay."""
    setup = CNN_SWEEPS[name][1 if ctx.quick else 0]
    run = Runner(ctx, {"sweep": setup, "weight_decays": WEIGHT_DECAYS})
    data = mnist_subset(ctx, setup.train_size, setup.test_size)
    fit, held = split_test(data)
    stat_x = data.x_train[: setup.stat_size]

    def stat_inputs() -> list[torch.Tensor]:
        return list(stat_x.split(_STAT_BATCH))

    def measure(wd: float, mult: float) -> dict[str, Any]:
        return _measure_pair(run, setup, data, (fit, held), stat_inputs, wd, mult)

    rows, figures = sweep(
        run,
        setup.multipliers,
        measure,
        stage=lambda wd, mult: f"x{mult:g}-wd{wd:g}",
        figure=lambda wd, mult, _row: (
            f"paths_{setup.model}_wd{wd:g}_x{mult:g}.png",
            f"{setup.model} x{mult:g}, weight decay {wd:g} (BatchNorm reset, calibrated)",
        ),
    )
    return run.result(format_table(rows, COLUMNS), rows, figures, _notes(setup))


def _measure_pair(
    run: Runner,
    setup: CNNSweep,
    data: Dataset,
    split: tuple[Batches, Batches],
    stat_inputs: Callable[[], list[torch.Tensor]],
    wd: float,
    mult: float,
) -> dict[str, Any]:
    """One sweep row: a pair trained at width ``mult`` and weight decay ``wd``, its naive
    and weight-matched paths (BatchNorm reset at each point) and the naive midpoint
    with stale running statistics."""
    start = time.perf_counter()
    config = dataclasses.replace(setup.train, weight_decay=wd)
    model, a, b = run.train_pair(
        f"{setup.model}-x{mult:g}-wd{wd:g}",
        lambda seed: create_model(setup.model, seed=seed, **setup.model_kwargs(mult)),
        data,
        config,
    )
    train_seconds = time.perf_counter() - start
    fit, held = split
    # BatchNorm reset at every point: averaging two networks' weights shrinks the
    # variance of their features, so the stored running statistics no longer fit
    measured, paths, matching = naive_and_matched(
        model,
        a,
        b,
        fit,
        held,
        points=setup.points,
        seed=run.ctx.seed,
        prepare=reset_prepare(model, stat_inputs),
        meta={"fix": "reset_bn"},
    )
    # the naive midpoint once more with the endpoints' averaged running statistics
    stale = calibrate(model, interpolate(a, b, 0.5), fit(), held()).after
    naive, wm = paths["naive"], paths["weight_matching"]
    return {
        "model": setup.model,
        "weight_decay": wd,
        "multiplier": mult,
        "channels": _width_label(model),
        "parameters": sum(v.numel() for k, v in a.items() if "running" not in k),
        **measured,
        "naive_mid_acc": naive.midpoint_acc,
        "naive_mid_acc_no_reset": stale.acc,
        "wm_mid_acc": wm.midpoint_acc,
        "wm_sweeps": matching.iterations,
        "train_seconds": round(train_seconds, 1),
        "seconds": round(time.perf_counter() - start, 1),
    }


def _notes(setup: CNNSweep) -> str:
    return (
        f"{setup.model} (norm=batch) on {setup.train_size} MNIST training images, SGD lr "
        f"{setup.train.lr}, {setup.train.epochs} epochs; barriers over {setup.points} points, "
        f"BatchNorm reset on {setup.stat_size} training images at each point, each point "
        f"calibrated on {CALIBRATION_FRACTION:.0%} of {setup.test_size} test images and measured "
        "on the rest; 'mid' = naive midpoint accuracy, 'no reset' = the same midpoint with "
        "the endpoints' averaged running statistics"
    )


@register_experiment("width-sweep-vgg", paper=PAPER)
def width_sweep_vgg(ctx: ExperimentContext) -> ExperimentResult:
    """Permutation-free merging vs width and weight decay (MNIST VGG with BatchNorm reset)."""
    return _cnn_width_sweep(ctx, "vgg")


@register_experiment("width-sweep-resnet20", paper=PAPER)
def width_sweep_resnet20(ctx: ExperimentContext) -> ExperimentResult:
    """Permutation-free merging vs width and weight decay (MNIST ResNet20, BatchNorm reset)."""
    return _cnn_width_sweep(ctx, "resnet20")
