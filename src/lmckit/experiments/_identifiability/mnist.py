"""``asym-lmc`` (Q1, Fig. 4) and ``kappa-sweep`` (Q2, Fig. 3) on MNIST MLPs.

* ``asym-lmc``: unaligned and aligned barriers for an MLP, a W-asymmetric MLP with
  ``κ = 0`` and with large ``κ``, and a syre MLP.
* ``kappa-sweep``: activation-matching objective ``⟨P, C⟩ / n`` of the identity vs the
  optimal vs 100 random permutations as ``κ`` goes from 0 to 5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lmckit.data import Dataset, batches
from lmckit.diagnostics._identifiability import (
    MatchingObjective,
    activation_matching_objectives,
    overall_objective,
)
from lmckit.experiments._compare import compare_alignments
from lmckit.experiments._datasets import mnist_subset
from lmckit.experiments._identifiability.common import PAPER, trained_plain_pair
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.measure._measure import EvalSettings, measure_path
from lmckit.measure._table import Column, format_table
from lmckit.training._train import TrainConfig

__all__ = ["MNIST_FULL", "MNIST_QUICK", "MnistSetup"]

#: fixed-weight scale of the "large κ" W-asymmetric MLP (center-dominated regime)
_KAPPA_LARGE = 1.0
#: fixed-offset scale of the syre MLP (dense offsets on all 784 inputs)
_KAPPA_SYRE = 0.1
METHODS = ("naive", "activation_matching", "weight_matching")


@dataclass(frozen=True)
class MnistSetup:
    """MNIST MLPs: 784 -> hidden -> 10, LayerNorm + GELU (paper App. F.1).

    Attributes:
        hidden: hidden widths.
        num_fixed: fixed entries per row, one per Linear (hidden layers, then head).
        train_size: first images of the 8,000 training ones (``None``: all).
        train: optimisation (AdamW, lr 1e-3, weight decay 0.01 in the paper).
        stat_batches: 500-image training batches for activation statistics.
    """

    hidden: tuple[int, ...] = (512, 512, 512)
    num_fixed: tuple[int, ...] = (64, 64, 64, 256)
    train_size: int | None = None
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            epochs=10, batch_size=128, optimizer="adamw", lr=1e-3, weight_decay=0.01
        )
    )
    stat_batches: int = 8


MNIST_FULL = MnistSetup()
MNIST_QUICK = MnistSetup(
    hidden=(32, 32),
    num_fixed=(64, 8, 16),
    train_size=1000,
    train=TrainConfig(epochs=2, batch_size=100, optimizer="adamw", lr=1e-3, weight_decay=0.01),
    stat_batches=2,
)


def _base(data: Dataset, setup: MnistSetup) -> dict[str, Any]:
    return {
        "in_features": math.prod(data.input_shape),
        "hidden": list(setup.hidden),
        "out_features": data.num_classes,
        "activation": "gelu",
        "norm": "layer",
    }


# --------------------------------------------------------------------------- asym-lmc

ASYM_COLUMNS = (
    Column("model", "model", align="<"),
    Column("acc A/B", lambda r: f"{100 * r['acc_a']:.1f}/{100 * r['acc_b']:.1f}"),
    *(
        column
        for method, title in zip(
            METHODS, ("unaligned", "act. matching", "weight matching"), strict=True
        )
        for column in (
            Column(f"{title}: loss", f"{method}_loss_barrier", ".3f"),
            Column("acc", f"{method}_acc_barrier", ".2f", scale=100.0, suffix="%"),
        )
    ),
)


@register_experiment("asym-lmc", paper=PAPER)
def asym_lmc(ctx: ExperimentContext) -> ExperimentResult:
    """Unaligned vs aligned barriers: MLP, W-asym (κ=0, large κ), syre MLP on MNIST."""
    setup = MNIST_QUICK if ctx.quick else MNIST_FULL
    nf = list(setup.num_fixed)
    variants = {
        "mlp": {"mode": "plain"},
        "wasym k=0": {"mode": "wasym", "kappa": 0.0, "num_fixed": nf},
        f"wasym k={_KAPPA_LARGE:g}": {"mode": "wasym", "kappa": _KAPPA_LARGE, "num_fixed": nf},
        f"syre k={_KAPPA_SYRE:g}": {"mode": "syre", "kappa": _KAPPA_SYRE},
    }
    run = Runner(ctx, {"setup": setup, "variants": variants})
    data = mnist_subset(ctx, setup.train_size)
    settings = EvalSettings(stat_batches=setup.stat_batches)
    rows = []
    for name, variant in variants.items():
        ctx.log(f"asym-lmc: two {name} models")
        plain, (a, b) = trained_plain_pair(run, variant, _base(data, setup), data, setup.train)
        paths = compare_alignments(
            plain, plain.symmetry_spec(), a, b, data, settings, methods=METHODS, seed=ctx.seed
        )
        row: dict[str, Any] = {
            "model": name,
            "acc_a": paths["naive"].acc[0],
            "acc_b": paths["naive"].acc[-1],
        }
        for method, res in paths.items():
            row[f"{method}_loss_barrier"] = res.barrier_loss
            row[f"{method}_acc_barrier"] = res.barrier_acc
        rows.append(row)
    fig, ax = run.subplots(figsize=(7, 4), constrained_layout=True)
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["naive_loss_barrier"] for r in rows], 0.4, label="unaligned")
    ax.bar(
        [x + 0.2 for x in xs],
        [r["activation_matching_loss_barrier"] for r in rows],
        0.4,
        label="activation matching",
    )
    ax.set_xticks(list(xs), [r["model"] for r in rows])
    ax.set_ylabel("test loss barrier")
    ax.legend()
    figure = run.save_figure(fig, "asym_lmc.png")
    return run.result(format_table(rows, ASYM_COLUMNS), rows, [figure])


# --------------------------------------------------------------------------- kappa-sweep


def _objective_row(kappa: float, layer: str, obj: MatchingObjective) -> dict[str, Any]:
    return {
        "kappa": kappa,
        "layer": layer,
        "identity": obj.identity,
        "optimal": obj.optimal,
        "random_mean": obj.random_mean,
        "random_std": obj.random_std,
        "identity_gap": obj.identity_gap,
    }


KAPPA_COLUMNS = (
    Column("kappa", "kappa", "g"),
    Column("layer", "layer", align="<"),
    Column("identity", "identity", ".3f"),
    Column("optimal", "optimal", ".3f"),
    Column("random", lambda r: f"{r['random_mean']:.3f}±{r['random_std']:.3f}"),
    Column("gap", "identity_gap", ".3f"),
    Column("unaligned loss barrier", "unaligned_loss_barrier", ".3f", missing=""),
)


@register_experiment("kappa-sweep", paper=PAPER)
def kappa_sweep(ctx: ExperimentContext) -> ExperimentResult:
    """Activation-matching objective of identity vs optimal vs random as κ goes 0 → 5."""
    setup = MNIST_QUICK if ctx.quick else MNIST_FULL
    kappas = (0.0, 1.0) if ctx.quick else (0.0, 0.25, 0.5, 1.0, 2.0, 5.0)
    run = Runner(ctx, {"setup": setup, "kappas": kappas})
    data = mnist_subset(ctx, setup.train_size)
    inputs: list[Tensor] = [
        x for x, _ in batches(data.x_train, data.y_train, 500, limit=setup.stat_batches)
    ]
    rows: list[dict[str, Any]] = []
    for kappa in kappas:
        ctx.log(f"kappa-sweep: two W-asym MLPs with kappa={kappa:g}")
        variant = {"mode": "wasym", "kappa": kappa, "num_fixed": list(setup.num_fixed)}
        plain, (a, b) = trained_plain_pair(run, variant, _base(data, setup), data, setup.train)
        per_layer = activation_matching_objectives(
            plain, plain.symmetry_spec(), a, b, inputs, random=100, seed=ctx.seed
        )
        rows += [_objective_row(kappa, layer, obj) for layer, obj in per_layer.items()]
        rows.append(_objective_row(kappa, "all", overall_objective(per_layer)))
        naive = measure_path(plain, a, b, data, EvalSettings(stat_batches=setup.stat_batches))
        rows[-1]["unaligned_loss_barrier"] = naive.barrier_loss
        rows[-1]["unaligned_acc_barrier"] = naive.barrier_acc
    overall = [r for r in rows if r["layer"] == "all"]
    fig, ax = run.subplots(figsize=(6, 4), constrained_layout=True)
    ks = [r["kappa"] for r in overall]
    ax.plot(ks, [r["optimal"] for r in overall], "o-", label="optimal")
    ax.plot(ks, [r["identity"] for r in overall], "s-", label="identity")
    ax.errorbar(
        ks,
        [r["random_mean"] for r in overall],
        yerr=[r["random_std"] for r in overall],
        fmt="^-",
        label="random (100)",
    )
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("fixed-weight scale κ")
    ax.set_ylabel("⟨P, C⟩ / n (mean Pearson r)")
    ax.legend()
    figure = run.save_figure(fig, "kappa_sweep.png")
    notes = "gap = (optimal - identity) / (optimal - random): 0 when the identity is optimal."
    return run.result(format_table(rows, KAPPA_COLUMNS), rows, [figure], notes)
