"""``landscape``: three MNIST MLPs beyond the straight line (Garipov et al. 2018; Draxler et
al. 2018; Ainsworth et al. 2023).

- The plane through three independently trained MLPs, unaligned and with the second and
  third weight-matched to the first: the barrier between the three minima, then (nearly)
  gone.
- Between the first two, unaligned: the straight line, a trained quadratic Bezier curve
  and an AutoNEB-style elastic band (:mod:`lmckit.paths._neb`); the plane through the two
  models and the Bezier control point, with the curve drawn (Garipov et al.'s figure).
- Ensembles: 5 points of each curve averaged, beside each endpoint, the two endpoints'
  ensemble and their (unaligned) uniform soup.

Data: MNIST's t10k images (first 8,000 train, last 2,000 test). The models are trained
as ``lmckit train --model mlp --width W --depth 2 --optimizer adam --lr 1e-3 --epochs E
--seed S`` trains them (the same build and the same :func:`lmckit.training.fit`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from lmckit.data import Dataset, batches
from lmckit.experiments._compare import align_pair
from lmckit.experiments._datasets import mnist_subset
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.measure._evaluate import PathResult, evaluate_path
from lmckit.measure._plot import plot_paths, plot_planes
from lmckit.measure._table import Column, format_table, percent
from lmckit.models import create_model
from lmckit.paths import (
    BandConfig,
    PlaneResult,
    ensemble_metrics,
    evaluate_curve,
    evaluate_plane,
    fit_band,
    fit_curve,
    plane_frame,
)
from lmckit.paths._curves import CurveLike
from lmckit.paths._ensemble import even_ts
from lmckit.paths._plane import plane_axes
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import apply
from lmckit.training._train import TrainConfig

__all__ = ["LandscapeSetup"]


@dataclass(frozen=True)
class LandscapeSetup:
    """What the experiment trains and measures (hashed into its cache folder).

    Attributes:
        hidden: hidden widths of the 784-...-10 ReLU MLPs.
        train_size, test_size: MNIST images (``None``: all 8,000 / 2,000).
        train: the three models' training.
        bezier: the quadratic Bezier curve's training.
        band_train, band: the elastic band's training and growth.
        resolution, margin: each plane's grid.
        points: points measured along each path.
        ensemble: points of a curve in its ensemble.
    """

    hidden: tuple[int, ...]
    train_size: int | None
    test_size: int | None
    train: TrainConfig
    bezier: TrainConfig
    band_train: TrainConfig
    band: BandConfig
    resolution: int
    margin: float
    points: int
    ensemble: int


FULL = LandscapeSetup(
    hidden=(256, 256),
    train_size=None,
    test_size=None,
    train=TrainConfig(epochs=5, batch_size=128, optimizer="adam", lr=1e-3),
    bezier=TrainConfig(epochs=10, batch_size=128, optimizer="adam", lr=1e-3),
    band_train=TrainConfig(epochs=10, batch_size=128, optimizer="sgd", lr=0.02),
    band=BandConfig(),
    resolution=21,
    margin=0.2,
    points=21,
    ensemble=5,
)
QUICK = LandscapeSetup(
    hidden=(32,),
    train_size=1000,
    test_size=300,
    train=TrainConfig(epochs=2, batch_size=64, optimizer="adam", lr=3e-3),
    bezier=TrainConfig(epochs=2, batch_size=64, optimizer="adam", lr=3e-3),
    band_train=TrainConfig(epochs=2, batch_size=64, optimizer="sgd", lr=0.1),
    band=BandConfig(pivots=2, cycles=2, insert=1, probe_examples=200),
    resolution=5,
    margin=0.2,
    points=5,
    ensemble=3,
)

PATH_COLUMNS = (
    Column("path", "path", align="<"),
    Column("loss barrier", "barrier_loss", ".4f"),
    percent("acc barrier", "barrier_acc"),
    Column("/ linear", "ratio", ".3f"),
    Column("fit s", "fit_seconds", ".1f"),
    Column("s / step", "step_seconds", ".4f"),
)
ENSEMBLE_COLUMNS = (
    Column("model", "model", align="<"),
    Column("loss", "loss", ".4f"),
    percent("acc", "acc"),
)


def _recorded(setup: LandscapeSetup) -> dict[str, Any]:
    """``setup`` as JSON values (an infinite spring as ``"inf"``), for the runner's record."""
    plain = asdict(setup)
    plain["band"]["spring"] = str(setup.band.spring)
    return plain


def _mlp(setup: LandscapeSetup, seed: int) -> tuple[Any, Params]:
    return create_model(
        "mlp", seed=seed, in_features=784, hidden=list(setup.hidden), out_features=10
    )


def _plane(
    model: Any,
    models: list[Params],
    data: Dataset,
    setup: LandscapeSetup,
    labels: list[str],
    curve: CurveLike | None = None,
) -> dict[str, Any]:
    names = [n for n, _ in model.named_parameters()]
    frame = plane_frame(*models, names=names)
    xs, ys = plane_axes(frame, setup.resolution, setup.margin)
    drawn = [curve.point(t) for t in even_ts(41)] if curve is not None else []
    start = time.perf_counter()
    result = evaluate_plane(
        model,
        models,
        frame,
        partial(batches, data.x_test, data.y_test, 500),
        xs=xs,
        ys=ys,
        labels=labels,
        curve=drawn,
    )
    seconds = time.perf_counter() - start
    count = len(xs) * len(ys) + 6
    return {**result.to_dict(), "seconds": seconds, "seconds_per_point": seconds / count}


def _curve_stage(
    model: Any, a: Params, b: Params, data: Dataset, setup: LandscapeSetup, kind: str, seed: int
) -> tuple[dict[str, Any], CurveLike]:
    start = time.perf_counter()
    if kind == "neb":
        curve: CurveLike = fit_band(model, a, b, data, setup.band_train, setup.band, seed=seed)
    else:
        curve = fit_curve(model, a, b, data, setup.bezier, kind=kind, seed=seed)
    seconds = time.perf_counter() - start
    steps = int(getattr(curve, "steps", 0))
    test = partial(batches, data.x_test, data.y_test, 500)
    path = evaluate_curve(model, curve, test, points=setup.points)
    ts = even_ts(setup.ensemble)
    members = [a, *(curve.point(t) for t in ts[1:-1]), b, interpolate(a, b, 0.5)]
    k = len(ts)
    measured = ensemble_metrics(
        model, members, [list(range(k)), [0], [k - 1], [0, k - 1], [k]], test
    )
    names = ["curve ensemble", "A", "B", "ensemble of A and B", "uniform soup of A and B"]
    out = {
        "path": path.to_dict(),
        "fit_seconds": seconds,
        "steps": steps,
        "step_seconds": seconds / max(steps, 1),
        "controls": len(curve.controls),
        "ensemble": [
            {"model": n, "loss": m.loss, "acc": m.acc} for n, m in zip(names, measured, strict=True)
        ],
    }
    return out, curve


@register_experiment("landscape", paper="Garipov et al. 2018; Draxler et al. 2018; Git Re-Basin")
def landscape(ctx: ExperimentContext) -> ExperimentResult:
    """Three MNIST MLPs: planes unaligned vs aligned; line vs Bezier vs band; curve ensembles."""
    setup = QUICK if ctx.quick else FULL
    run = Runner(ctx, _recorded(setup))
    data = mnist_subset(ctx, setup.train_size, setup.test_size)
    trained = [
        run.train(
            f"mlp-seed{ctx.seed + i}",
            partial(_mlp, setup, ctx.seed + i),
            data,
            setup.train,
            seed=ctx.seed + i,
        )
        for i in range(3)
    ]
    model = trained[0][0]
    a, b, c = (p for _, p in trained)
    spec = model.symmetry_spec()
    test = partial(batches, data.x_test, data.y_test, 500)
    line = run.stage(
        "linear", lambda: evaluate_path(model, a, b, test, points=setup.points).to_dict()
    )
    moved = {}
    for name, other in (("B", b), ("C", c)):
        wm = align_pair("weight_matching", model, spec, a, other, data, seed=ctx.seed)
        assert wm is not None  # weight matching always returns a transform
        moved[name] = apply(spec, other, wm.transform)
    aligned = run.stage(
        "aligned linear",
        lambda: evaluate_path(model, a, moved["B"], test, points=setup.points).to_dict(),
    )
    labels = ["A", "B", "C"]
    planes = {
        "unaligned": run.stage(
            "plane unaligned", lambda: _plane(model, [a, b, c], data, setup, labels)
        ),
        "aligned": run.stage(
            "plane aligned",
            lambda: _plane(
                model, [a, moved["B"], moved["C"]], data, setup, ["A", "B aligned", "C aligned"]
            ),
        ),
    }
    curves = {
        kind: run.stage(kind, partial(_curve_and_plane, model, a, b, data, setup, kind, ctx.seed))
        for kind in ("bezier", "neb")
    }
    planes["through the Bezier curve"] = curves["bezier"]["plane"]
    return _result(run, ctx, setup, line, aligned, curves, planes)


def _curve_and_plane(
    model: Any,
    a: Params,
    b: Params,
    data: Dataset,
    setup: LandscapeSetup,
    kind: str,
    seed: int,
) -> dict[str, Any]:
    """The ``kind`` curve's stage; for the Bezier curve, with the plane through the two
    models and its control point, the curve drawn on it (Garipov et al.'s figure)."""
    out, curve = _curve_stage(model, a, b, data, setup, kind, seed)
    if kind == "bezier":
        corners = [a, b, curve.controls[0]]
        out["plane"] = _plane(model, corners, data, setup, ["A", "B", "control point"], curve)
    return out


def _result(
    run: Runner,
    ctx: ExperimentContext,
    setup: LandscapeSetup,
    line: dict[str, Any],
    aligned: dict[str, Any],
    curves: dict[str, dict[str, Any]],
    planes: dict[str, dict[str, Any]],
) -> ExperimentResult:
    paths = {
        "linear": PathResult.from_dict(line),
        **{k: PathResult.from_dict(v["path"]) for k, v in curves.items()},
        "linear, B weight-matched": PathResult.from_dict(aligned),
    }
    base = paths["linear"].barrier_loss
    rows = [
        {
            "path": name,
            "barrier_loss": r.barrier_loss,
            "barrier_acc": r.barrier_acc,
            "ratio": r.barrier_loss / base if base > 0 else None,
            "fit_seconds": curves.get(name, {}).get("fit_seconds", 0.0),
            "step_seconds": curves.get(name, {}).get("step_seconds", 0.0),
        }
        for name, r in paths.items()
    ]
    lines = [
        format_table(
            rows,
            PATH_COLUMNS,
            title=f"MLP 784-{'-'.join(map(str, setup.hidden))}-10, A to B, test split",
        ),
        "",
    ]
    for kind, entry in curves.items():
        lines += [
            format_table(
                entry["ensemble"],
                ENSEMBLE_COLUMNS,
                title=f"{kind}: {setup.ensemble} points averaged",
            ),
            "",
        ]
    for name, plane in planes.items():
        at = ", ".join(
            f"{m['path']} {m['loss']:.4f}/{m['plane_loss']:.4f}" for m in plane["models"]
        )
        flat = [v for row in plane["grid"]["loss"] for v in row]
        lines.append(
            f"plane {name}: loss {min(flat):.4f} to {max(flat):.4f}; at the models "
            f"(as itself / on the plane) {at}; {plane['seconds_per_point']:.4f} s per point"
        )
    figures = [
        plot_planes(
            {k: PlaneResult.from_dict(v) for k, v in planes.items()}, ctx.out_dir / "planes.png"
        ),
        plot_paths(paths, ctx.out_dir / "paths.png", title="A to B: line, curves, aligned line"),
    ]
    table_rows = [
        *rows,
        *(
            {"plane": k, "model": m["path"], "loss": m["loss"], "plane_loss": m["plane_loss"]}
            for k, v in planes.items()
            for m in v["models"]
        ),
    ]
    return run.result("\n".join(lines), table_rows, figures, f"hidden {list(setup.hidden)}")
