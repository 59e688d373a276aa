"""Permutation-free LMC of wide MLPs, its mechanisms, and curved paths (MNIST).

Reproduces arXiv 2510.08023 ("Do We Really Need Permutations?") on CPU scale and
Garipov et al. 2018 (trained Bezier curves):

- ``width-sweep``: merged accuracy and loss barrier vs width, no permutation vs weight
  matching, weight decay 3e-3 vs 1e-4, every path point temperature-calibrated.
- ``width-sweep-vgg`` / ``width-sweep-resnet20``: the same for BatchNorm CNNs (a
  3-conv VGG-style net and ResNet20), BatchNorm statistics reset at every path point.
- ``weight-decay``: LEWC cosine, weak additivity, reciprocal orthogonality and effective
  rank per layer vs weight decay at the widest width.
- ``bezier``: linear vs trained quadratic-Bezier (and chain) barrier between two
  unaligned MLPs, with CKA and top Hessian eigenvalue along both paths.

Models: ``784 -> w -> w -> w -> 10`` ReLU MLPs, ``w = BASE_WIDTH * multiplier``. The
paper's 1x is 512 units; on a 2-core CPU we use ``BASE_WIDTH = 32`` (so our 16x = 512 =
the paper's 1x). CNNs: see :data:`CNN_SWEEPS` (subsets of the training images). Data:
MNIST's t10k images, first 8000 train, last 2000 test; the inverse temperature is fitted
on the first 20 % of the test split and every reported metric is on the remaining 80 %.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lmckit.align import weight_matching
from lmckit.calibration import calibrate, evaluate_path_calibrated
from lmckit.data import Dataset, batches, load_mnist
from lmckit.diagnostics.curvature import path_top_eigenvalues
from lmckit.diagnostics.similarity import path_cka
from lmckit.diagnostics.width import (
    effective_rank,
    lewc_cosine,
    reciprocal_orthogonality_per_layer,
    weak_additivity_per_layer,
)
from lmckit.evaluate import PathResult, evaluate_path
from lmckit.experiments.registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.merge import reset_prepare
from lmckit.models import create_model
from lmckit.params import Params, interpolate
from lmckit.paths.curves import evaluate_curve, fit_curve
from lmckit.plot import plot_paths
from lmckit.symmetry import apply
from lmckit.train import TrainConfig, train

__all__ = [
    "BASE_WIDTH",
    "CNN_SWEEPS",
    "DEPTH",
    "MULTIPLIERS",
    "VGG_LAYOUT",
    "CNNSweep",
    "WidthSettings",
]

PAPER = "arXiv 2510.08023 (Do We Really Need Permutations?); Garipov et al. 2018"
BASE_WIDTH = 32
DEPTH = 3
MULTIPLIERS = (1, 2, 4, 8, 16)
WEIGHT_DECAYS = (3e-3, 1e-4)
CALIBRATION_FRACTION = 0.2


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


def _settings(ctx: ExperimentContext) -> WidthSettings:
    return QUICK if ctx.quick else FULL


def _data(ctx: ExperimentContext, settings: WidthSettings) -> Dataset:
    full = load_mnist(ctx.data("mnist"))
    return Dataset(
        "mnist",
        full.x_train[: settings.train_size],
        full.y_train[: settings.train_size],
        full.x_test[: settings.test_size],
        full.y_test[: settings.test_size],
        full.num_classes,
    )


def _split_test(data: Dataset) -> tuple[Callable, Callable]:
    """Batches of the calibration part (first 20 %) and the evaluation part of the test split."""
    cut = int(CALIBRATION_FRACTION * len(data.x_test))
    x, y = data.x_test, data.y_test
    return (lambda: batches(x[:cut], y[:cut], 500)), (lambda: batches(x[cut:], y[cut:], 500))


def _train_pair(
    ctx: ExperimentContext, data: Dataset, width: int, config: TrainConfig
) -> tuple[torch.nn.Module, Params, Params]:
    trained = []
    for s in (ctx.seed, ctx.seed + 1):
        model, init = create_model(
            "mlp", seed=s, in_features=784, hidden=[width] * DEPTH, out_features=10
        )
        ctx.log(f"training MLP width {width}, weight decay {config.weight_decay}, seed {s}")
        trained.append(train(model, init, data, config, seed=s, progress=ctx.progress))
    return model, trained[0], trained[1]


def _hidden_sites(prefix: str) -> list[str]:
    return [f"{prefix}.{i}" for i in range(DEPTH)]


def _reading_layers() -> list[str]:
    # every Linear layer that reads a hidden space (the first reads pixels, shared by both)
    return [f"layers.{i}" for i in range(1, DEPTH)] + ["head"]


@register_experiment("width-sweep", paper=PAPER)
def width_sweep(ctx: ExperimentContext) -> ExperimentResult:
    """Permutation-free merging vs width and weight decay (MNIST MLPs, calibrated)."""
    settings = _settings(ctx)
    data = _data(ctx, settings)
    fit, held = _split_test(data)
    probe = data.x_train[: settings.probe_size]
    rows = []
    figures = []
    for wd in WEIGHT_DECAYS:
        config = TrainConfig(**{**settings.train.__dict__, "weight_decay": wd})
        for mult in settings.multipliers:
            width = settings.base_width * mult
            start = time.perf_counter()
            model, a, b = _train_pair(ctx, data, width, config)
            spec = model.symmetry_spec()
            b_wm = apply(spec, b, weight_matching(spec, a, b, seed=ctx.seed).transform)
            paths: dict[str, PathResult] = {}
            for method, other in (("naive", b), ("weight_matching", b_wm)):
                paths[method] = evaluate_path_calibrated(
                    model, a, other, fit, held, points=settings.points, meta={"method": method}
                )
            ratio = reciprocal_orthogonality_per_layer(model, a, b, probe, _reading_layers())
            naive, wm = paths["naive"], paths["weight_matching"]
            rows.append(
                {
                    "weight_decay": wd,
                    "multiplier": mult,
                    "width": width,
                    "acc_a": naive.acc[0],
                    "acc_b": naive.acc[-1],
                    "naive_acc_barrier": naive.barrier_acc,
                    "naive_mid_acc_barrier": 0.5 * (naive.acc[0] + naive.acc[-1])
                    - naive.midpoint_acc,
                    "naive_loss_barrier": naive.barrier_loss,
                    "wm_acc_barrier": wm.barrier_acc,
                    "wm_mid_acc_barrier": 0.5 * (wm.acc[0] + wm.acc[-1]) - wm.midpoint_acc,
                    "wm_loss_barrier": wm.barrier_loss,
                    "naive_mid_inverse_temperature": naive.meta["inverse_temperature"][
                        len(naive.t) // 2
                    ],
                    "recip_orth": sum(ratio.values()) / len(ratio),
                    "recip_orth_per_layer": ratio,
                    "paths": {k: v.to_dict() for k, v in paths.items()},
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
            if mult == settings.multipliers[-1]:
                figures.append(
                    plot_paths(
                        paths,
                        ctx.out_dir / f"paths_wd{wd:g}_width{width}.png",
                        title=f"MLP width {width}, weight decay {wd:g} (calibrated)",
                    )
                )
    header = (
        f"{'wd':>7}{'mult':>5}{'width':>6}{'acc A/B %':>13}{'naive accB %':>13}"
        f"{'(mid)':>7}{'naive lossB':>12}{'WM accB %':>10}{'WM lossB':>9}{'RO ratio':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['weight_decay']:>7.0e}{r['multiplier']:>4}x{r['width']:>6}"
            f"{100 * r['acc_a']:>7.2f}/{100 * r['acc_b']:<5.2f}"
            f"{100 * r['naive_acc_barrier']:>13.2f}{100 * r['naive_mid_acc_barrier']:>7.2f}"
            f"{r['naive_loss_barrier']:>12.4f}{100 * r['wm_acc_barrier']:>10.2f}"
            f"{r['wm_loss_barrier']:>9.4f}{r['recip_orth']:>9.3f}"
        )
    notes = (
        f"base width {settings.base_width} (paper's 1x = 512); {DEPTH} hidden layers; "
        f"SGD lr {settings.train.lr}, {settings.train.epochs} epochs; barriers over "
        f"{settings.points} points, each calibrated on {CALIBRATION_FRACTION:.0%} of the test "
        "split and measured on the rest; RO = mean over reading layers of "
        "(E||W_a z_b||/E||W_a z_a|| + E||W_b z_a||/E||W_b z_b||)/2"
    )
    return ExperimentResult("\n".join(lines), rows, figures, notes)


@register_experiment("weight-decay", paper=PAPER)
def weight_decay(ctx: ExperimentContext) -> ExperimentResult:
    """LEWC, weak additivity, reciprocal orthogonality and rank vs weight decay (widest MLP)."""
    settings = _settings(ctx)
    data = _data(ctx, settings)
    fit, held = _split_test(data)
    probe = data.x_train[: settings.probe_size]
    width = settings.base_width * settings.multipliers[-1]
    rows = []
    for wd in (1e-4, 1e-3, 3e-3):
        config = TrainConfig(**{**settings.train.__dict__, "weight_decay": wd})
        model, a, b = _train_pair(ctx, data, width, config)
        lewc = lewc_cosine(model, a, b, probe, [*_hidden_sites("acts"), "head"])
        additivity = weak_additivity_per_layer(model, a, b, probe, _hidden_sites("acts"))
        ratio = reciprocal_orthogonality_per_layer(model, a, b, probe, _reading_layers())
        ranks = {
            f"layers.{i}": 0.5
            * (effective_rank(a[f"layers.{i}.weight"]) + effective_rank(b[f"layers.{i}.weight"]))
            for i in range(DEPTH)
        }
        path = evaluate_path_calibrated(model, a, b, fit, held, ts=[0.0, 0.5, 1.0])
        rows.append(
            {
                "weight_decay": wd,
                "width": width,
                "lewc": lewc,
                "weak_additivity": additivity,
                "recip_orth": ratio,
                "effective_rank": ranks,
                "acc_a": path.acc[0],
                "acc_b": path.acc[-1],
                "merged_acc": path.acc[1],
                "merged_calibrated_loss": path.loss[1],
            }
        )

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
    return ExperimentResult("\n".join(lines), rows, [], f"width {width}, probes on train images")


BEZIER_TRAIN = TrainConfig(epochs=10, batch_size=128, optimizer="adam", lr=1e-3)
BEZIER_CURVE = TrainConfig(epochs=10, batch_size=128, optimizer="adam", lr=1e-3)


@register_experiment("bezier", paper="Garipov et al. 2018 (arXiv 1802.10026)")
def bezier(ctx: ExperimentContext) -> ExperimentResult:
    """Linear vs trained Bezier / chain barrier between two unaligned MNIST MLPs."""
    quick = ctx.quick
    width = 16 if quick else 256
    data = _data(ctx, QUICK if quick else FULL)
    train_cfg = BEZIER_TRAIN if not quick else TrainConfig(epochs=2, lr=3e-3)
    curve_cfg = BEZIER_CURVE if not quick else TrainConfig(epochs=2, lr=3e-3)
    model, a, b = _train_pair(ctx, data, width, train_cfg)
    x, y = data.x_test, data.y_test

    def test_batches():
        return batches(x, y, 500)

    points = 5 if quick else 11
    paths: dict[str, PathResult] = {
        "linear": evaluate_path(model, a, b, test_batches, points=points, meta={"path": "linear"})
    }
    curves = {}
    seconds = {}
    for kind in ("bezier", "chain"):
        ctx.log(f"training the {kind} path")
        start = time.perf_counter()
        curves[kind] = fit_curve(
            model, a, b, data, curve_cfg, kind=kind, seed=ctx.seed, progress=ctx.progress
        )
        seconds[kind] = round(time.perf_counter() - start, 1)
        paths[kind] = evaluate_curve(model, curves[kind], test_batches, points=points)
    # diagnostics on the midpoint and ends of the line and the Bezier curve
    probe = data.x_test[: 200 if quick else 1000]
    hess_data = [(data.x_train[:256], data.y_train[:256])]
    ts = [0.0, 0.5, 1.0]
    sites = ["acts.0", f"acts.{DEPTH - 1}"]

    def line(t: float) -> Params:
        return interpolate(a, b, t)

    diag = {}
    for name, point in (("linear", line), ("bezier", curves["bezier"].point)):
        cka = path_cka(model, point, probe, sites, ts)
        eig = path_top_eigenvalues(model, point, hess_data, ts, iters=20 if quick else 50)
        diag[name] = {
            "mid_cka_to_a": {s: cka.to_a[s][1] for s in sites},
            "top_eigenvalue": dict(zip(("t=0", "t=0.5", "t=1"), eig, strict=True)),
        }
    rows = [
        {
            "path": name,
            "barrier_loss": r.barrier_loss,
            "barrier_acc": r.barrier_acc,
            "midpoint_loss": r.midpoint_loss,
            "midpoint_acc": r.midpoint_acc,
            "ratio_to_linear": r.barrier_loss / paths["linear"].barrier_loss,
            "fit_seconds": seconds.get(name, 0.0),
            "diagnostics": diag.get(name, {}),
            "path_result": r.to_dict(),
        }
        for name, r in paths.items()
    ]
    header = (
        f"{'path':<8}{'loss barrier':>13}{'acc barrier %':>15}{'mid acc %':>10}{'/ linear':>10}"
    )
    lines = [f"MLP 784-{width}x{DEPTH}-10, unaligned endpoints, test split", header]
    for r in rows:
        lines.append(
            f"{r['path']:<8}{r['barrier_loss']:>13.4f}{100 * r['barrier_acc']:>15.2f}"
            f"{100 * r['midpoint_acc']:>10.2f}{r['ratio_to_linear']:>10.3f}"
        )
    lines.append("")
    for name, d in diag.items():
        lines.append(
            f"{name}: midpoint CKA to A "
            + ", ".join(f"{s} {v:.3f}" for s, v in d["mid_cka_to_a"].items())
            + "; top Hessian eigenvalue "
            + ", ".join(f"{k} {v:.2f}" for k, v in d["top_eigenvalue"].items())
        )
    figure = plot_paths(paths, ctx.out_dir / "bezier_vs_linear.png", title="linear vs curved")
    return ExperimentResult("\n".join(lines), rows, [figure], f"width {width}")


# --- CNN width sweeps (VGG, ResNet20 with BatchNorm) --------------------------------------

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


def _cnn_data(ctx: ExperimentContext, sweep: CNNSweep) -> Dataset:
    full = load_mnist(ctx.data("mnist"))
    return Dataset(
        "mnist",
        full.x_train[: sweep.train_size],
        full.y_train[: sweep.train_size],
        full.x_test[: sweep.test_size],
        full.y_test[: sweep.test_size],
        full.num_classes,
    )


def _width_label(model: torch.nn.Module) -> str:
    """Channels of every stage / conv, e.g. ``16-32-64``."""
    widths = getattr(model, "widths", None) or [site[-1] for site in model.conv_sites]
    return "-".join(str(w) for w in widths)


def _cnn_width_sweep(ctx: ExperimentContext, name: str) -> ExperimentResult:
    """Permutation-free vs weight-matched merging of BatchNorm CNNs vs width and decay."""
    sweep = CNN_SWEEPS[name][1 if ctx.quick else 0]
    data = _cnn_data(ctx, sweep)
    fit, held = _split_test(data)
    stat_x = data.x_train[: sweep.stat_size]

    def stat_inputs() -> list[torch.Tensor]:
        return list(stat_x.split(_STAT_BATCH))

    rows = []
    figures = []
    for wd in WEIGHT_DECAYS:
        config = TrainConfig(**{**sweep.train.__dict__, "weight_decay": wd})
        for mult in sweep.multipliers:
            start = time.perf_counter()
            trained = []
            for s in (ctx.seed, ctx.seed + 1):
                model, init = create_model(sweep.model, seed=s, **sweep.model_kwargs(mult))
                ctx.log(f"training {sweep.model} x{mult:g}, weight decay {wd:g}, seed {s}")
                trained.append(train(model, init, data, config, seed=s, progress=ctx.progress))
            a, b = trained
            train_seconds = time.perf_counter() - start
            spec = model.symmetry_spec()
            wm_result = weight_matching(spec, a, b, seed=ctx.seed)
            b_wm = apply(spec, b, wm_result.transform)
            # BatchNorm reset at every point: averaging two networks' weights shrinks the
            # variance of their features, so the stored running statistics no longer fit
            reset = reset_prepare(model, stat_inputs)
            paths: dict[str, PathResult] = {}
            for method, other in (("naive", b), ("weight_matching", b_wm)):
                paths[method] = evaluate_path_calibrated(
                    model,
                    a,
                    other,
                    fit,
                    held,
                    points=sweep.points,
                    prepare=reset,
                    meta={"method": method, "fix": "reset_bn"},
                )
            # the naive midpoint once more with the endpoints' averaged running statistics
            stale = calibrate(model, interpolate(a, b, 0.5), fit(), held()).after
            naive, wm = paths["naive"], paths["weight_matching"]
            mid = len(naive.t) // 2
            rows.append(
                {
                    "model": sweep.model,
                    "weight_decay": wd,
                    "multiplier": mult,
                    "channels": _width_label(model),
                    "parameters": sum(v.numel() for k, v in a.items() if "running" not in k),
                    "acc_a": naive.acc[0],
                    "acc_b": naive.acc[-1],
                    "naive_acc_barrier": naive.barrier_acc,
                    "naive_loss_barrier": naive.barrier_loss,
                    "naive_mid_acc": naive.midpoint_acc,
                    "naive_mid_acc_no_reset": stale.acc,
                    "wm_acc_barrier": wm.barrier_acc,
                    "wm_loss_barrier": wm.barrier_loss,
                    "wm_mid_acc": wm.midpoint_acc,
                    "wm_sweeps": wm_result.iterations,
                    "naive_mid_inverse_temperature": naive.meta["inverse_temperature"][mid],
                    "paths": {k: v.to_dict() for k, v in paths.items()},
                    "train_seconds": round(train_seconds, 1),
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
            if mult == sweep.multipliers[-1]:
                figures.append(
                    plot_paths(
                        paths,
                        ctx.out_dir / f"paths_{sweep.model}_wd{wd:g}_x{mult:g}.png",
                        title=f"{sweep.model} x{mult:g}, weight decay {wd:g} "
                        "(BatchNorm reset, calibrated)",
                    )
                )
    header = (
        f"{'wd':>7}{'mult':>7}{'channels':>12}{'acc A/B %':>13}{'naive accB %':>13}"
        f"{'lossB':>8}{'mid %':>7}{'no reset':>9}{'WM accB %':>10}{'WM lossB':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['weight_decay']:>7.0e}{str(r['multiplier']) + 'x':>7}{r['channels']:>12}"
            f"{100 * r['acc_a']:>7.2f}/{100 * r['acc_b']:<5.2f}"
            f"{100 * r['naive_acc_barrier']:>13.2f}{r['naive_loss_barrier']:>8.4f}"
            f"{100 * r['naive_mid_acc']:>7.2f}{100 * r['naive_mid_acc_no_reset']:>9.2f}"
            f"{100 * r['wm_acc_barrier']:>10.2f}{r['wm_loss_barrier']:>9.4f}"
        )
    notes = (
        f"{sweep.model} (norm=batch) on {sweep.train_size} MNIST training images, SGD lr "
        f"{sweep.train.lr}, {sweep.train.epochs} epochs; barriers over {sweep.points} points, "
        f"BatchNorm reset on {sweep.stat_size} training images at each point, each point "
        f"calibrated on {CALIBRATION_FRACTION:.0%} of {sweep.test_size} test images and measured "
        "on the rest; 'mid %' = naive midpoint accuracy, 'no reset' = the same midpoint with "
        "the endpoints' averaged running statistics"
    )
    return ExperimentResult("\n".join(lines), rows, figures, notes)


@register_experiment("width-sweep-vgg", paper=PAPER)
def width_sweep_vgg(ctx: ExperimentContext) -> ExperimentResult:
    """Permutation-free merging vs width and weight decay (MNIST VGG with BatchNorm reset)."""
    return _cnn_width_sweep(ctx, "vgg")


@register_experiment("width-sweep-resnet20", paper=PAPER)
def width_sweep_resnet20(ctx: ExperimentContext) -> ExperimentResult:
    """Permutation-free merging vs width and weight decay (MNIST ResNet20, BatchNorm reset)."""
    return _cnn_width_sweep(ctx, "resnet20")
