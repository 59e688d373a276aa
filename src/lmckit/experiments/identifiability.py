"""Neuron identifiability experiments (Boehm et al., "Beyond structural symmetries", §6).

* ``asym-lmc`` (Q1, Fig. 4): unaligned and aligned barriers on MNIST for an MLP, a
  W-asymmetric MLP with ``κ = 0`` and with large ``κ``, and a syre MLP.
* ``kappa-sweep`` (Q2, Fig. 3): activation-matching objective ``⟨P, C⟩ / n`` of the
  identity vs the optimal vs 100 random permutations as ``κ`` goes from 0 to 5.
* ``swap-costs`` (Q3, Fig. 5): swap-cost matrices ``Δ_ij = d_ij + d_ji - d_ii - d_jj``
  of the first layer of W-asymmetric MLPs on Gaussian mixtures of intrinsic dimension
  2, 8, 32, for ``κ ∈ {0, 1}``.
* ``coherence`` (Q4, Fig. 6): teacher ``relu(z1 + z2)`` on a 2-D latent embedded by
  ``c`` copies (coherence ``1/c``; exact-copy and random-frame families); midpoint
  barrier of a one-hidden-layer W-asymmetric student (``κ = 0``) against coherence.

Every asymmetric model is folded by :func:`lmckit.models.asymmetric.to_plain` before
alignment or path evaluation (the fold commutes with interpolation, see there).
"""

from __future__ import annotations

import copy
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI; set before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.func import functional_call  # noqa: E402

from lmckit.atomic import atomic_path  # noqa: E402
from lmckit.compare import EvalSettings, compare_alignments, measure_path  # noqa: E402
from lmckit.data import Dataset, batches, load_mnist, make_gmm  # noqa: E402
from lmckit.diagnostics.identifiability import (  # noqa: E402
    MatchingObjective,
    activation_matching_objectives,
    chord_deviation,
    coherence,
    input_subspace,
    min_center_gap,
    overall_objective,
    realization_cost_matrix,
    ridge_cost_matrix,
    swap_costs,
)
from lmckit.experiments.registry import (  # noqa: E402
    ExperimentContext,
    ExperimentResult,
    register_experiment,
)
from lmckit.models import ZooModel, create_model  # noqa: E402
from lmckit.models.asymmetric import AsymLinear, asym_parts, create_asym_model, to_plain  # noqa: E402
from lmckit.params import Params, interpolate  # noqa: E402
from lmckit.train import TrainConfig, train  # noqa: E402

__all__ = [
    "MnistSetup",
    "coherence_embedding",
    "swap_cost_summary",
    "trained_plain_pair",
]

PAPER = "Boehm et al., Beyond Structural Symmetries: LMC via Neuron Identifiability"

#: fixed-weight scale of the "large κ" W-asymmetric MLP (center-dominated regime)
KAPPA_LARGE = 1.0
#: fixed-offset scale of the syre MLP (dense offsets on all 784 inputs)
KAPPA_SYRE = 0.1


# --------------------------------------------------------------------------- MNIST models


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


def _mnist(ctx: ExperimentContext, setup: MnistSetup) -> Dataset:
    data = load_mnist(ctx.data("mnist"))
    if setup.train_size is not None:
        data = Dataset(
            data.name,
            data.x_train[: setup.train_size],
            data.y_train[: setup.train_size],
            data.x_test,
            data.y_test,
            data.num_classes,
        )
    return data


def trained_plain_pair(
    variant: dict[str, Any],
    base_kwargs: dict[str, Any],
    data: Dataset,
    config: TrainConfig,
    seeds: Sequence[int],
    *,
    progress: bool = False,
) -> tuple[ZooModel, list[Params]]:
    """Train one model per seed and return their plain (folded) forms.

    ``variant``: ``{"mode": "plain"}`` for the zoo MLP, else the asymmetric kwargs
    (``mode``, ``kappa``, ``num_fixed``; mask and fixed seeds stay 0, shared by all
    runs). Initial weights and data order come from each seed.
    """
    out: list[Params] = []
    plain: ZooModel | None = None
    for seed in seeds:
        if variant["mode"] == "plain":
            module, init = create_model("mlp", seed=seed, **base_kwargs)
            plain, trained = module, train(module, init, data, config, seed=seed, progress=progress)
        else:
            module, init = create_asym_model("asym_mlp", seed=seed, **base_kwargs, **variant)
            trained = train(module, init, data, config, seed=seed, progress=progress)
            plain, trained = to_plain(module, trained)
        out.append(trained)
    assert plain is not None
    return plain, out


def _mnist_base(data: Dataset, setup: MnistSetup) -> dict[str, Any]:
    return {
        "in_features": math.prod(data.input_shape),
        "hidden": list(setup.hidden),
        "out_features": data.num_classes,
        "activation": "gelu",
        "norm": "layer",
    }


def _stat_inputs(data: Dataset, n_batches: int) -> list[Tensor]:
    return [x for x, _ in batches(data.x_train, data.y_train, 500, limit=n_batches)]


def _save(fig: plt.Figure, path: Any) -> Any:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- asym-lmc


@register_experiment("asym-lmc", paper=PAPER)
def asym_lmc(ctx: ExperimentContext) -> ExperimentResult:
    """Unaligned vs aligned barriers: MLP, W-asym (κ=0, large κ), syre MLP on MNIST."""
    setup = MNIST_QUICK if ctx.quick else MNIST_FULL
    data = _mnist(ctx, setup)
    base = _mnist_base(data, setup)
    nf = list(setup.num_fixed)
    variants = {
        "mlp": {"mode": "plain"},
        "wasym k=0": {"mode": "wasym", "kappa": 0.0, "num_fixed": nf},
        f"wasym k={KAPPA_LARGE:g}": {"mode": "wasym", "kappa": KAPPA_LARGE, "num_fixed": nf},
        f"syre k={KAPPA_SYRE:g}": {"mode": "syre", "kappa": KAPPA_SYRE},
    }
    settings = EvalSettings(stat_batches=setup.stat_batches)
    rows = []
    for name, variant in variants.items():
        ctx.log(f"asym-lmc: training two {name} models")
        start = time.perf_counter()
        plain, (a, b) = trained_plain_pair(
            variant, base, data, setup.train, (ctx.seed, ctx.seed + 1), progress=ctx.progress
        )
        paths = compare_alignments(
            plain,
            plain.symmetry_spec(),
            a,
            b,
            data,
            settings,
            methods=("naive", "activation_matching", "weight_matching"),
            seed=ctx.seed,
        )
        row: dict[str, Any] = {
            "model": name,
            "acc_a": paths["naive"].acc[0],
            "acc_b": paths["naive"].acc[-1],
            "seconds": round(time.perf_counter() - start, 1),
        }
        for method, res in paths.items():
            row[f"{method}_loss_barrier"] = res.barrier_loss
            row[f"{method}_acc_barrier"] = res.barrier_acc
        rows.append(row)
    header = (
        f"{'model':<14}{'acc A/B':>14}{'unaligned':>22}{'act. matching':>22}{'weight matching':>22}"
    )
    sub = f"{'':<14}{'':>14}" + f"{'loss':>11}{'acc':>11}" * 3
    lines = [header, sub, "-" * len(header)]
    for r in rows:
        cells = "".join(
            f"{r[f'{m}_loss_barrier']:>11.3f}{100 * r[f'{m}_acc_barrier']:>10.2f}%"
            for m in ("naive", "activation_matching", "weight_matching")
        )
        ends = f"{100 * r['acc_a']:.1f}/{100 * r['acc_b']:.1f}"
        lines.append(f"{r['model']:<14}{ends:>14}{cells}")
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
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
    figure = _save(fig, ctx.out_dir / "asym_lmc.png")
    return ExperimentResult("\n".join(lines), rows, [figure])


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


@register_experiment("kappa-sweep", paper=PAPER)
def kappa_sweep(ctx: ExperimentContext) -> ExperimentResult:
    """Activation-matching objective of identity vs optimal vs random as κ goes 0 → 5."""
    setup = MNIST_QUICK if ctx.quick else MNIST_FULL
    kappas = (0.0, 1.0) if ctx.quick else (0.0, 0.25, 0.5, 1.0, 2.0, 5.0)
    data = _mnist(ctx, setup)
    base = _mnist_base(data, setup)
    inputs = _stat_inputs(data, setup.stat_batches)
    rows: list[dict[str, Any]] = []
    barriers: dict[float, float] = {}
    for kappa in kappas:
        ctx.log(f"kappa-sweep: training two W-asym MLPs with kappa={kappa:g}")
        variant = {"mode": "wasym", "kappa": kappa, "num_fixed": list(setup.num_fixed)}
        plain, (a, b) = trained_plain_pair(
            variant, base, data, setup.train, (ctx.seed, ctx.seed + 1), progress=ctx.progress
        )
        per_layer = activation_matching_objectives(
            plain, plain.symmetry_spec(), a, b, inputs, random=100, seed=ctx.seed
        )
        for layer, obj in per_layer.items():
            rows.append(_objective_row(kappa, layer, obj))
        rows.append(_objective_row(kappa, "all", overall_objective(per_layer)))
        naive = measure_path(plain, a, b, data, EvalSettings(stat_batches=setup.stat_batches))
        barriers[kappa] = naive.barrier_loss
        rows[-1]["unaligned_loss_barrier"] = naive.barrier_loss
        rows[-1]["unaligned_acc_barrier"] = naive.barrier_acc
    header = (
        f"{'kappa':>6} {'layer':<10}{'identity':>10}{'optimal':>10}{'random':>16}"
        f"{'gap':>8}{'unaligned loss barrier':>24}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        rand = f"{r['random_mean']:.3f}±{r['random_std']:.3f}"
        barrier = f"{r['unaligned_loss_barrier']:>24.3f}" if r["layer"] == "all" else ""
        lines.append(
            f"{r['kappa']:>6g} {r['layer']:<10}{r['identity']:>10.3f}{r['optimal']:>10.3f}"
            f"{rand:>16}{r['identity_gap']:>8.3f}{barrier}"
        )
    overall = [r for r in rows if r["layer"] == "all"]
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
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
    figure = _save(fig, ctx.out_dir / "kappa_sweep.png")
    notes = "gap = (optimal - identity) / (optimal - random): 0 when the identity is optimal."
    return ExperimentResult("\n".join(lines), rows, [figure], notes)


# --------------------------------------------------------------------------- swap-costs


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


@register_experiment("swap-costs", paper=PAPER)
def swap_costs_experiment(ctx: ExperimentContext) -> ExperimentResult:
    """Swap-cost matrices on Gaussian mixtures of intrinsic dimension 2, 8, 32; κ ∈ {0, 1}."""
    quick = ctx.quick
    dims = (2, 32) if quick else (2, 8, 32)
    kappas = (0.0, 1.0)
    ambient, width = 64, (32 if quick else 128)
    config = TrainConfig(
        epochs=2 if quick else 30, batch_size=128, optimizer="adamw", lr=1e-3, weight_decay=0.01
    )
    rows: list[dict[str, Any]] = []
    deltas: dict[tuple[int, float], Tensor] = {}
    for k in dims:
        data = make_gmm(
            dim=ambient,
            intrinsic_dim=k,
            classes=5,
            n_train=500 if quick else 4000,
            n_test=500 if quick else 1000,
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
            trained = []
            module = None
            for seed in (ctx.seed, ctx.seed + 1):
                module, init = create_asym_model("asym_mlp", seed=seed, **kwargs)
                trained.append(train(module, init, data, config, seed=seed, progress=ctx.progress))
            assert module is not None
            a = trained[0]
            basis = input_subspace(data.x_train, explained=0.9)
            mask, offset = a["layers.0.mask"], a["layers.0.offset"]
            weights = mask * a["layers.0.weight"] + offset
            costs = realization_cost_matrix(basis, mask, offset, weights)
            delta = swap_costs(costs)
            ridge = ridge_cost_matrix(data.x_train, mask, offset, weights, ridge=1e-3)
            deltas[(k, kappa)] = delta
            plain, pa = to_plain(module, a)
            _, pb = to_plain(module, trained[1])
            path = measure_path(plain, pa, pb, data, EvalSettings(split="train"))
            row = {
                "intrinsic_dim": k,
                "kappa": kappa,
                "pca_dim": basis.shape[1],
                "coherence": coherence(basis),
                "min_center_gap": min_center_gap(basis, offset),
                "mean_self_cost": float(costs.diagonal().mean()),
                **swap_cost_summary(delta, costs.diagonal()),
                **{
                    f"ridge_{key}": v
                    for key, v in swap_cost_summary(swap_costs(ridge), ridge.diagonal()).items()
                },
                "train_acc_ends": (path.acc[0] + path.acc[-1]) / 2,
                "train_acc_mid": path.midpoint_acc,
                "unaligned_mid_drop": (path.acc[0] + path.acc[-1]) / 2 - path.midpoint_acc,
            }
            rows.append(row)
    header = (
        f"{'k':>3}{'kappa':>6}{'pca':>5}{'min gap':>9}{'d_ii':>8}{'q05':>8}{'median':>8}"
        f"{'cheap':>7}{'neg':>7}{'ridge cheap':>12}{'mid drop':>10}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['intrinsic_dim']:>3}{r['kappa']:>6g}{r['pca_dim']:>5}{r['min_center_gap']:>9.3f}"
            f"{r['mean_self_cost']:>8.3f}{r['rel_q05']:>8.3f}{r['rel_median']:>8.3f}"
            f"{100 * r['cheap_fraction']:>6.1f}%{100 * r['negative_fraction']:>6.1f}%"
            f"{100 * r['ridge_cheap_fraction']:>11.1f}%{100 * r['unaligned_mid_drop']:>9.2f}%"
        )
    fig, axes = plt.subplots(
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
    figure = _save(fig, ctx.out_dir / "swap_costs.png")
    notes = (
        "relative swap cost Δ_ij/(d_ii+d_jj) over neuron pairs of layer 0 (Mahalanobis, PCA at "
        "90%); cheap: < 0.1; ridge: λ=1e-3 surrogate; mid drop: unaligned train-accuracy drop."
    )
    return ExperimentResult("\n".join(lines), rows, [figure], notes)


# --------------------------------------------------------------------------- coherence

FAMILIES = ("exact-copy", "random-frame")


def coherence_embedding(
    copies: int, ambient: int, family: str, *, generator: torch.Generator | None = None
) -> Tensor:
    """Embedding ``E`` (``(ambient, 2)``, orthonormal columns) of a 2-D latent (App. F.5).

    ``exact-copy``: ``x[r] = z_1 / √c`` for ``r < c`` and ``x[c + r] = z_2 / √c``.
    ``random-frame``: ``c`` pairs of coordinates ``(π(2r), π(2r+1))`` each hold
    ``R(θ_r) z / √c`` for a random permutation ``π`` and angles ``θ_r`` (drawn from
    ``generator``; reuse one generator state to keep them across ``c``). Both have
    subspace coherence ``1 / c``. Needs ``2c <= ambient``.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if copies < 1 or 2 * copies > ambient:
        raise ValueError(f"need 1 <= copies <= ambient / 2, got {copies} and {ambient}")
    emb = torch.zeros(ambient, 2)
    scale = 1 / math.sqrt(copies)
    if family == "exact-copy":
        emb[:copies, 0] = scale
        emb[copies : 2 * copies, 1] = scale
        return emb
    gen = generator or torch.Generator().manual_seed(0)
    perm = torch.randperm(ambient, generator=gen)
    angles = 2 * math.pi * torch.rand(ambient // 2, generator=gen)
    for r in range(copies):
        c, s = math.cos(float(angles[r])), math.sin(float(angles[r]))
        emb[perm[2 * r]] = torch.tensor([c, -s]) * scale
        emb[perm[2 * r + 1]] = torch.tensor([s, c]) * scale
    return emb


class _Student(nn.Module):
    """``f(x) = Σ_i relu(w_iᵀ x + b_i)``: W-asymmetric hidden layer, output weights 1."""

    def __init__(self, ambient: int, width: int, *, num_fixed: int, mask_seed: int) -> None:
        super().__init__()
        linear = nn.Linear(ambient, width)
        mask, offset = asym_parts(
            linear.weight.shape,
            kappa=0.0,
            num_fixed=num_fixed,
            mode="wasym",
            mask_seed=mask_seed,
            fixed_seed=0,
            layer=0,
        )
        self.hidden = AsymLinear(linear, mask, offset)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.hidden(x)).sum(-1)

    def hidden_layer(self) -> nn.Module:
        """``x -> relu(hidden(x))`` with the same parameter names (``hidden.*``)."""
        return nn.Sequential(OrderedDict(hidden=self.hidden, act=nn.ReLU()))


def _fit_student(
    model: _Student, x: Tensor, y: Tensor, *, epochs: int, seed: int, lr: float = 1e-2
) -> Params:
    """AdamW (weight decay 1e-4) on the mean squared error; returns trained params."""
    work = copy.deepcopy(model)
    opt = torch.optim.AdamW(work.parameters(), lr=lr, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for xb, yb in batches(x, y, 64, shuffle=True, generator=gen):
            loss = ((work(xb) - yb) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return {k: v.detach().clone() for k, v in work.state_dict().items()}


def _mse(model: nn.Module, params: Params, x: Tensor, y: Tensor) -> float:
    with torch.no_grad():
        return float(((functional_call(model, params, (x,)) - y) ** 2).mean())


@register_experiment("coherence", paper=PAPER)
def coherence_experiment(ctx: ExperimentContext) -> ExperimentResult:
    """Teacher relu(z1 + z2) on c-copy embeddings: midpoint barrier vs coherence 1/c."""
    quick = ctx.quick
    ambient, width = 32, 16
    copies_list = (1, 16) if quick else (1, 2, 4, 8, 16)
    outer = 1 if quick else 2
    pairs = 1 if quick else 3
    epochs = 5 if quick else 20
    gen = torch.Generator().manual_seed(ctx.seed)
    z_train = torch.randn(2048, 2, generator=gen)
    z_test = torch.randn(1024, 2, generator=gen)

    def teacher(z: Tensor) -> Tensor:
        return torch.relu(z[:, 0] + z[:, 1])

    rows = []
    for family in FAMILIES:
        for copies in copies_list:
            barriers, end_losses, measured, chords = [], [], [], []
            for o in range(outer):
                frame = torch.Generator().manual_seed(1000 * (ctx.seed + 1) + o)
                emb = coherence_embedding(copies, ambient, family, generator=frame)
                x_train, x_test = z_train @ emb.T, z_test @ emb.T
                measured.append(coherence(input_subspace(x_train, explained=0.999)))
                for p in range(pairs):
                    seeds = (10_000 * o + 2 * p + ctx.seed, 10_000 * o + 2 * p + 1 + ctx.seed)
                    trained = []
                    for s in seeds:
                        with torch.random.fork_rng(devices=[]):
                            torch.manual_seed(s)
                            student = _Student(ambient, width, num_fixed=ambient // 2, mask_seed=o)
                        trained.append(
                            _fit_student(student, x_train, teacher(z_train), epochs=epochs, seed=s)
                        )
                    y_test = teacher(z_test)
                    la, lb = (_mse(student, t, x_test, y_test) for t in trained)
                    mid = _mse(student, interpolate(trained[0], trained[1], 0.5), x_test, y_test)
                    barriers.append(mid - (la + lb) / 2)
                    end_losses.append((la + lb) / 2)
                    layer = student.hidden_layer()
                    chords.append(
                        chord_deviation(layer, trained[0], trained[1], x_test, ts=(0.5,))[0]
                    )
            bt = torch.tensor(barriers)
            rows.append(
                {
                    "family": family,
                    "copies": copies,
                    "coherence": 1 / copies,
                    "measured_coherence": sum(measured) / len(measured),
                    "midpoint_barrier_mean": float(bt.mean()),
                    "midpoint_barrier_std": float(bt.std()) if len(barriers) > 1 else 0.0,
                    "endpoint_mse": sum(end_losses) / len(end_losses),
                    "chord_deviation_mid": sum(chords) / len(chords),
                    "pairs": len(barriers),
                }
            )
            ctx.log(f"coherence: {family} c={copies}: barrier {float(bt.mean()):.4f}")
    header = (
        f"{'family':<14}{'copies':>7}{'coherence':>11}{'measured':>10}"
        f"{'mid barrier':>20}{'end MSE':>10}{'chord dev':>11}{'pairs':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        barrier = f"{r['midpoint_barrier_mean']:.4f}±{r['midpoint_barrier_std']:.4f}"
        lines.append(
            f"{r['family']:<14}{r['copies']:>7}{r['coherence']:>11.4f}"
            f"{r['measured_coherence']:>10.4f}{barrier:>20}{r['endpoint_mse']:>10.4f}"
            f"{r['chord_deviation_mid']:>11.4f}{r['pairs']:>7}"
        )
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for family in FAMILIES:
        fam = [r for r in rows if r["family"] == family]
        ax.errorbar(
            [r["coherence"] for r in fam],
            [r["midpoint_barrier_mean"] for r in fam],
            yerr=[r["midpoint_barrier_std"] for r in fam],
            fmt="o-",
            capsize=3,
            label=family,
        )
    ax.set_xscale("log")
    ax.set_xlabel("subspace coherence 1/c")
    ax.set_ylabel("midpoint MSE barrier (test)")
    ax.legend()
    figure = _save(fig, ctx.out_dir / "coherence.png")
    return ExperimentResult("\n".join(lines), rows, [figure])
