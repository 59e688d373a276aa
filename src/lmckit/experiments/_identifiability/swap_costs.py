"""``swap-costs`` (Q3, Fig. 5): swap-cost matrices of the first layer of W-asymmetric MLPs.

``Δ_ij = d_ij + d_ji - d_ii - d_jj`` on Gaussian mixtures of intrinsic dimension 2, 8,
32, for ``κ ∈ {0, 1}``.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmckit.data import Dataset, make_gmm
from lmckit.diagnostics._identifiability import (
    coherence,
    input_subspace,
    min_center_gap,
    realization_cost_matrix,
    ridge_cost_matrix,
    swap_costs,
)
from lmckit.experiments._identifiability._asymmetric import create_asym_model, to_plain
from lmckit.experiments._identifiability.common import PAPER
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.measure._measure import EvalSettings, measure_path
from lmckit.measure._table import Column, format_table, percent
from lmckit.symmetry._params import Params
from lmckit.training._train import TrainConfig

__all__ = ["swap_cost_summary"]


def _asym_mlp(kwargs: dict[str, Any], seed: int) -> tuple[Any, dict[str, Tensor]]:
    return create_asym_model("asym_mlp", seed=seed, **kwargs)


def swap_cost_summary(delta: Tensor, diag: Tensor, *, cheap: float = 0.1) -> dict[str, float]:
    """Summary of off-diagonal relative swap costs ``Δ_ij / (d_ii + d_jj)``.

    ``delta``: ``(n, n)`` swap costs; ``diag``: ``(n,)`` realization costs ``d_ii``.
    Returns the 5 % quantile and median of the relative cost, the fraction of pairs
    below ``cheap`` ("cheap swaps") and the fraction below 0. Infinite entries (a
    function the other neuron cannot realise) count as expensive.
    """
    n = delta.shape[0]
    off = ~torch.eye(n, dtype=torch.bool)
    rel = (delta / (diag[:, None] + diag[None, :]).clamp_min(1e-12))[off]
    rel = torch.where(torch.isnan(rel), torch.full_like(rel, math.inf), rel)
    finite = rel[torch.isfinite(rel)]
    q = (lambda p: float(torch.quantile(finite, p))) if finite.numel() else (lambda p: math.inf)
    return {
        "rel_q05": q(0.05),
        "rel_median": q(0.5),
        "cheap_fraction": float((rel < cheap).double().mean()),
        "negative_fraction": float((rel < 0).double().mean()),
    }


COLUMNS = (
    Column("k", "intrinsic_dim"),
    Column("kappa", "kappa", "g"),
    Column("pca", "pca_dim"),
    Column("min gap", "min_center_gap", ".3f"),
    Column("d_ii", "mean_self_cost", ".3f"),
    Column("q05", "rel_q05", ".3f"),
    Column("median", "rel_median", ".3f"),
    percent("cheap", "cheap_fraction", 1),
    percent("neg", "negative_fraction", 1),
    percent("ridge cheap", "ridge_cheap_fraction", 1),
    percent("mid drop", "unaligned_mid_drop"),
)


@register_experiment("swap-costs", paper=PAPER)
def swap_costs_experiment(ctx: ExperimentContext) -> ExperimentResult:
    """Swap-cost matrices on Gaussian mixtures of intrinsic dimension 2, 8, 32; κ ∈ {0, 1}."""
    quick = ctx.quick
    dims = (2, 32) if quick else (2, 8, 32)
    kappas = (0.0, 1.0)
    ambient, width = 64, (32 if quick else 128)
    n_train, n_test = (500, 500) if quick else (4000, 1000)
    config = TrainConfig(
        epochs=2 if quick else 30, batch_size=128, optimizer="adamw", lr=1e-3, weight_decay=0.01
    )
    run = Runner(
        ctx,
        {
            "dims": dims,
            "kappas": kappas,
            "width": width,
            "sizes": (n_train, n_test),
            "train": config,
        },
    )
    rows: list[dict[str, Any]] = []
    deltas: dict[tuple[int, float], Tensor] = {}
    for k in dims:
        data = make_gmm(
            dim=ambient,
            intrinsic_dim=k,
            classes=5,
            n_train=n_train,
            n_test=n_test,
            separation=3.0,
            seed=ctx.seed,
        )
        for kappa in kappas:
            ctx.log(f"swap-costs: intrinsic dim {k}, kappa {kappa:g}")
            kwargs = {
                "in_features": ambient,
                "hidden": [width],
                "out_features": 5,
                "mode": "wasym",
                "kappa": kappa,
                "num_fixed": [ambient // 4, width // 4],
            }
            module, a, b = run.train_pair(
                f"gmm{k}-k{kappa:g}",
                partial(_asym_mlp, kwargs),
                data,
                config,
            )
            row, deltas[(k, kappa)] = _swap_cost_row(module, a, b, data)
            rows.append({"intrinsic_dim": k, "kappa": kappa, **row})
    figure = _swap_cost_figure(run, deltas, dims, kappas)
    notes = (
        "relative swap cost Δ_ij/(d_ii+d_jj) over neuron pairs of layer 0 (Mahalanobis, PCA at "
        "90%); cheap: < 0.1; ridge: λ=1e-3 surrogate; mid drop: unaligned train-accuracy drop."
    )
    return run.result(format_table(rows, COLUMNS), rows, [figure], notes)


def _swap_cost_row(
    module: Any, a: Params, b: Params, data: Dataset
) -> tuple[dict[str, Any], Tensor]:
    """One pair's figures (layer 0's realization and swap costs, the unaligned path's
    accuracy drop) and its swap-cost matrix."""
    basis = input_subspace(data.x_train, explained=0.9)
    mask, offset = a["layers.0.mask"], a["layers.0.offset"]
    weights = mask * a["layers.0.weight"] + offset
    costs = realization_cost_matrix(basis, mask, offset, weights)
    delta = swap_costs(costs)
    ridge = ridge_cost_matrix(data.x_train, mask, offset, weights, ridge=1e-3)
    plain, pa = to_plain(module, a)
    _, pb = to_plain(module, b)
    path = measure_path(plain, pa, pb, data, EvalSettings(split="train"))
    ends = (path.acc[0] + path.acc[-1]) / 2
    ridge_summary = swap_cost_summary(swap_costs(ridge), ridge.diagonal())
    row = {
        "pca_dim": basis.shape[1],
        "coherence": coherence(basis),
        "min_center_gap": min_center_gap(basis, offset),
        "mean_self_cost": float(costs.diagonal().mean()),
        **swap_cost_summary(delta, costs.diagonal()),
        **{f"ridge_{key}": v for key, v in ridge_summary.items()},
        "train_acc_ends": ends,
        "train_acc_mid": path.midpoint_acc,
        "unaligned_mid_drop": ends - path.midpoint_acc,
    }
    return row, delta


def _swap_cost_figure(
    run: Runner,
    deltas: dict[tuple[int, float], Tensor],
    dims: tuple[int, ...],
    kappas: tuple[float, ...],
) -> Path:
    """The swap-cost matrices, one panel per intrinsic dimension and kappa."""
    fig, axes = run.subplots(
        len(kappas), len(dims), figsize=(4 * len(dims), 3.6 * len(kappas)), squeeze=False
    )
    for (k, kappa), delta in deltas.items():
        ax = axes[kappas.index(kappa)][dims.index(k)]
        finite = delta[torch.isfinite(delta)]
        bound = float(finite.abs().quantile(0.95)) if finite.numel() else 1.0
        image = ax.imshow(
            delta.clamp(-bound, bound).numpy(), cmap="RdBu_r", vmin=-bound, vmax=bound
        )
        ax.set_title(f"intrinsic dim {k}, κ={kappa:g}")
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    return run.save_figure(fig, "swap_costs.png")
