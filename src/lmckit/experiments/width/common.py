"""What the width experiments share: MNIST subsets, the calibration split, MLP pairs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from torch import Tensor

from lmckit.data import Dataset, batches
from lmckit.evaluate import PathResult
from lmckit.experiments.runner import Runner
from lmckit.models import ZooModel, create_model
from lmckit.params import Params
from lmckit.plot import plot_paths
from lmckit.train import TrainConfig

__all__ = [
    "BASE_WIDTH",
    "CALIBRATION_FRACTION",
    "DEPTH",
    "MULTIPLIERS",
    "PAPER",
    "WEIGHT_DECAYS",
    "mlp_pair",
    "split_test",
    "sweep",
]

PAPER = "arXiv 2510.08023 (Do We Really Need Permutations?); Garipov et al. 2018"
BASE_WIDTH = 32
DEPTH = 3
MULTIPLIERS = (1, 2, 4, 8, 16)
WEIGHT_DECAYS = (3e-3, 1e-4)
CALIBRATION_FRACTION = 0.2

Batches = Callable[[], Iterable[tuple[Tensor, Tensor]]]


def split_test(data: Dataset) -> tuple[Batches, Batches]:
    """Batches of the calibration part (first 20 %) and the evaluation part of the test split."""
    cut = int(CALIBRATION_FRACTION * len(data.x_test))
    x, y = data.x_test, data.y_test
    return (lambda: batches(x[:cut], y[:cut], 500)), (lambda: batches(x[cut:], y[cut:], 500))


def mlp_pair(
    run: Runner, data: Dataset, width: int, config: TrainConfig
) -> tuple[ZooModel, Params, Params]:
    """Two ``784 -> width x DEPTH -> 10`` ReLU MLPs, seeds ``seed`` and ``seed + 1``."""
    module, a, b = run.train_pair(
        f"mlp-w{width}-wd{config.weight_decay:g}-{config.optimizer}",
        lambda seed: create_model(
            "mlp", seed=seed, in_features=784, hidden=[width] * DEPTH, out_features=10
        ),
        data,
        config,
    )
    return module, a, b  # type: ignore[return-value]


def sweep(
    run: Runner,
    multipliers: Sequence[float],
    measure: Callable[[float, float], dict[str, Any]],
    *,
    stage: Callable[[float, float], str],
    figure: Callable[[float, float, dict[str, Any]], tuple[str, str]],
) -> tuple[list[dict[str, Any]], list[Path]]:
    """Rows ``measure(weight_decay, multiplier)`` over :data:`WEIGHT_DECAYS` and
    ``multipliers``, each a cached stage named ``stage(wd, mult)``; for the widest model of
    every decay, the figure of its ``paths``, named and titled by ``figure(wd, mult, row)``."""
    rows, figures = [], []
    for wd in WEIGHT_DECAYS:
        for mult in multipliers:
            row = run.stage(stage(wd, mult), partial(measure, wd, mult))
            rows.append(row)
            if mult == multipliers[-1]:
                name, title = figure(wd, mult, row)
                paths = {k: PathResult.from_dict(v) for k, v in row["paths"].items()}
                figures.append(plot_paths(paths, run.ctx.out_dir / name, title=title))
    return rows, figures
