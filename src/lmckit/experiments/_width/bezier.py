"""``bezier``: linear vs trained quadratic-Bezier (and chain) paths between two MNIST MLPs.

Garipov et al. 2018: the control point of a curve between two unaligned endpoints is
trained to minimise the expected loss along it; CKA to model A and the top Hessian
eigenvalue are measured at the ends and midpoints of the line and the Bezier curve.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from torch import Tensor, nn

from lmckit.data import Dataset, batches
from lmckit.diagnostics._curvature import path_top_eigenvalues
from lmckit.diagnostics._similarity import path_cka
from lmckit.experiments._datasets import mnist_subset
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.experiments._width.common import DEPTH, mlp_pair
from lmckit.experiments._width.mlp import FULL, QUICK
from lmckit.measure._evaluate import PathResult, evaluate_path
from lmckit.measure._plot import plot_paths
from lmckit.measure._table import Column, format_table, percent
from lmckit.paths._curves import Curve, evaluate_curve, fit_curve
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params
from lmckit.training._train import TrainConfig

__all__ = ["BEZIER_CURVE", "BEZIER_TRAIN"]

BEZIER_TRAIN = TrainConfig(epochs=10, batch_size=128, optimizer="adam", lr=1e-3)
BEZIER_CURVE = TrainConfig(epochs=10, batch_size=128, optimizer="adam", lr=1e-3)

COLUMNS = (
    Column("path", "path", align="<"),
    Column("loss barrier", "barrier_loss", ".4f"),
    percent("acc barrier", "barrier_acc"),
    percent("mid acc", "midpoint_acc"),
    Column("/ linear", "ratio_to_linear", ".3f"),
)


@register_experiment("bezier", paper="Garipov et al. 2018 (arXiv 1802.10026)")
def bezier(ctx: ExperimentContext) -> ExperimentResult:
    """Linear vs trained Bezier / chain barrier between two unaligned MNIST MLPs."""
    quick = ctx.quick
    width = 16 if quick else 256
    sizes = QUICK if quick else FULL
    train_cfg = BEZIER_TRAIN if not quick else TrainConfig(epochs=2, lr=3e-3)
    curve_cfg = BEZIER_CURVE if not quick else TrainConfig(epochs=2, lr=3e-3)
    points = 5 if quick else 11
    run = Runner(ctx, {"width": width, "train": train_cfg, "curve": curve_cfg, "sizes": sizes})
    data = mnist_subset(ctx, sizes.train_size, sizes.test_size)
    model, a, b = mlp_pair(run, data, width, train_cfg)
    x, y = data.x_test, data.y_test

    def test_batches():
        return batches(x, y, 500)

    paths, curves, seconds = _fitted_paths(ctx, model, a, b, data, curve_cfg, test_batches, points)
    diag = _diagnostics(model, a, b, curves["bezier"], data, quick)
    rows = _rows(paths, seconds, diag)
    title = f"MLP 784-{width}x{DEPTH}-10, unaligned endpoints, test split"
    lines = [format_table(rows, COLUMNS, title=title), ""]
    lines += [_diagnostics_line(name, d) for name, d in diag.items()]
    where = ctx.out_dir / "bezier_vs_linear.png"  # lmckit's own experiment folder
    figure = plot_paths(paths, where, title="linear vs curved", overwrite=True)
    return run.result("\n".join(lines), rows, [figure], f"width {width}")


def _fitted_paths(
    ctx: ExperimentContext,
    model: nn.Module,
    a: Params,
    b: Params,
    data: Dataset,
    curve_cfg: TrainConfig,
    test_batches: Callable[[], Iterable[tuple[Tensor, Tensor]]],
    points: int,
) -> tuple[dict[str, PathResult], dict[str, Curve], dict[str, float]]:
    """The line and the trained Bezier and chain paths from ``a`` to ``b``, evaluated on
    the test split; with the fitted curves and the seconds each took to train."""
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
    return paths, curves, seconds


def _diagnostics(
    model: nn.Module, a: Params, b: Params, bezier: Curve, data: Dataset, quick: bool
) -> dict[str, dict]:
    """Midpoint CKA to A and the top Hessian eigenvalue at the ends and midpoint of the
    line and the Bezier curve."""
    probe = data.x_test[: 200 if quick else 1000]
    hess_data = [(data.x_train[:256], data.y_train[:256])]
    ts = [0.0, 0.5, 1.0]
    sites = ["acts.0", f"acts.{DEPTH - 1}"]

    def line(t: float) -> Params:
        return interpolate(a, b, t)

    diag = {}
    for name, point in (("linear", line), ("bezier", bezier.point)):
        cka = path_cka(model, point, probe, sites, ts)
        eig = path_top_eigenvalues(model, point, hess_data, ts, iters=20 if quick else 50)
        diag[name] = {
            "mid_cka_to_a": {s: cka.to_a[s][1] for s in sites},
            "top_eigenvalue": dict(zip(("t=0", "t=0.5", "t=1"), eig, strict=True)),
        }
    return diag


def _rows(
    paths: dict[str, PathResult], seconds: dict[str, float], diag: dict[str, dict]
) -> list[dict]:
    """One result row per path: its barriers, its ratio to the line's, fit time, diagnostics."""
    return [
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


def _diagnostics_line(name: str, d: dict) -> str:
    return (
        f"{name}: midpoint CKA to A "
        + ", ".join(f"{s} {v:.3f}" for s, v in d["mid_cka_to_a"].items())
        + "; top Hessian eigenvalue "
        + ", ".join(f"{k} {v:.2f}" for k, v in d["top_eigenvalue"].items())
    )
