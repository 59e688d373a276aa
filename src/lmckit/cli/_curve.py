"""``lmckit curve``: fit a Bezier curve, a chain or an elastic band between two models."""

from __future__ import annotations

import math

import click
import torch

from lmckit.cli._common import (
    POSITIVE,
    check_out_dir,
    check_out_files,
    choice_option,
    data_option,
    fail,
    force_option,
    input_paths,
    join_processes,
    load_dataset,
    load_models,
    model_pair_arguments,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
)
from lmckit.measure._measure import EvalSettings, path_table
from lmckit.outputs._atomic import write_json
from lmckit.paths._neb import BandConfig
from lmckit.training._train import OPTIMIZERS, TrainConfig
from lmckit.workflow._curves import (
    CURVE_FIXES,
    KINDS,
    CurveSettings,
    FittedCurve,
    default_train_config,
    fit_pair_curve,
    save_curve,
)

__all__ = ["command"]


def _spring(value: str) -> float:
    try:
        spring = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number (or inf)") from None
    if not spring > 0 or math.isnan(spring):
        raise click.BadParameter(f"must be a positive number or inf, got {value}")
    return spring


@click.command("curve")
@model_pair_arguments
@choice_option(
    "--kind",
    KINDS,
    "bezier",
    "bezier: quadratic (more with --bends) Bezier "
    "curve; chain: polygonal chain; neb: AutoNEB-style nudged elastic band.",
)
@data_option
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    required=True,
    help="Curve folder: the control points or pivots, and a record of the endpoints.",
)
@click.option(
    "--bends", type=POSITIVE, default=1, show_default=True, help="bezier/chain: control points."
)
@click.option(
    "--pivots",
    type=POSITIVE,
    default=3,
    show_default=True,
    help="neb: interior pivots to start with, evenly spaced on the line.",
)
@click.option(
    "--cycles",
    type=POSITIVE,
    default=3,
    show_default=True,
    help="neb: training cycles; pivots are inserted after each but the last.",
)
@click.option(
    "--insert",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="neb: most pivots inserted after a cycle, where the band is highest.",
)
@click.option(
    "--spring",
    default="inf",
    show_default=True,
    help="neb: spring constant along the band; inf: pivots moved back to even "
    "spacing after every step (Draxler et al.'s choice).",
)
@click.option(
    "--epochs",
    type=POSITIVE,
    default=None,
    help="Passes over the training split (neb: in all cycles together). Default 10.",
)
@click.option(
    "--lr",
    type=float,
    default=None,
    help="Peak learning rate (cosine schedule). Default: 1e-3 (Adam) for bezier "
    "and chain, 0.02 (SGD, momentum 0.9) for neb.",
)
@choice_option("--optimizer", OPTIMIZERS, None, "Default: adam for bezier and chain, sgd for neb.")
@click.option("--batch-size", type=POSITIVE, default=128, show_default=True)
@click.option(
    "--max-seconds",
    type=float,
    default=None,
    help="Stop training after this much wall time; the curve is written as it is.",
)
@click.option(
    "--points",
    type=int,
    default=11,
    show_default=True,
    help="Points measured along the curve and the line (odd, 3 to 10,001).",
)
@choice_option("--split", ["test", "train"], "test")
@choice_option(
    "--fix",
    CURVE_FIXES,
    "auto",
    "Fix at each point: auto resets BatchNorm statistics where there are any.",
)
@click.option(
    "--circuits/--no-circuits",
    default=None,
    help="Transformers: the curve's form; default: as `lmckit align` recorded.",
)
@seed_option("Data order and the curve's samples of t.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False))
@force_option
@threads_option
@quiet_option
def command(
    model_a: str,
    model_b: str,
    kind: str,
    data_spec: str | None,
    out: str,
    bends: int,
    pivots: int,
    cycles: int,
    insert: int,
    spring: str,
    epochs: int | None,
    lr: float | None,
    optimizer: str | None,
    batch_size: int,
    max_seconds: float | None,
    points: int,
    split: str,
    fix: str,
    circuits: bool | None,
    seed: int,
    json_path: str | None,
    plot_path: str | None,
    force: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Fit a curve from MODEL_A to MODEL_B on --data's training split, measure it and the
    straight line, and write it to --out (points in the models' format)."""
    writer = join_processes()  # under torchrun: process 0 reports and writes
    quiet = quiet or not writer
    set_threads(threads)
    if max_seconds is not None and not max_seconds > 0:
        raise fail(f"--max-seconds must be positive, got {max_seconds}")
    if kind != "neb" and (pivots, cycles, insert, spring) != (3, 3, 2, "inf"):
        raise fail("--pivots, --cycles, --insert and --spring are for --kind neb")
    if kind == "neb" and bends != 1:
        raise fail("--bends is for bezier and chain; a band grows its own pivots (--pivots)")
    inputs = input_paths(model_a, model_b, data_spec=data_spec)
    if writer:
        check_out_dir(out, "curve", inputs, force)
        check_out_files(inputs, json=json_path, plot=plot_path)
    base = default_train_config(kind)
    train = TrainConfig(
        epochs=epochs or base.epochs,
        batch_size=batch_size,
        optimizer=optimizer or base.optimizer,
        lr=base.lr if lr is None else lr,
    )
    band = BandConfig(pivots=pivots, cycles=cycles, insert=insert, spring=_spring(spring))
    settings = CurveSettings(kind, bends, train, band, seed, max_seconds)
    evaluation = EvalSettings(split=split, points=points, fix=fix, dtype=torch.float32)
    data = load_dataset(data_spec)
    a, b = load_models([model_a, model_b], forms=True)
    meta = {"a": model_a, "b": model_b, "data": data_spec}
    fitted = fit_pair_curve(
        a, b, data, settings, evaluation, circuits=circuits, meta=meta, progress=not quiet
    )
    _report(fitted, kind)
    if not writer:
        return
    record = {"data": data_spec, "train": vars(train), "seed": seed}
    if kind == "neb":
        record["band"] = {**vars(band), "spring": str(band.spring)}
    else:
        record["bends"] = bends
    save_curve(out, fitted, a, b, [model_a, model_b], info=record, inputs=inputs, overwrite=force)
    click.echo(f"wrote {out}")
    _write(fitted, kind, json_path, plot_path)


def _report(fitted: FittedCurve, kind: str) -> None:
    if fitted.form.note:
        click.echo(f"form (as `lmckit align` recorded): {fitted.form.note}")
    steps = f"{fitted.steps} of {fitted.planned_steps} steps"
    if fitted.steps < fitted.planned_steps:
        steps += " (stopped by --max-seconds)"
    count = len(fitted.curve.controls)
    noun = ("pivot" if kind == "neb" else "control point") + ("s" if count > 1 else "")
    click.echo(f"fitted {kind} in {fitted.seconds:.1f} s, {steps}, {count} {noun}")
    click.echo(path_table({"linear": fitted.line, kind: fitted.path}))


def _write(fitted: FittedCurve, kind: str, json_path: str | None, plot_path: str | None) -> None:
    if json_path:
        write_json(json_path, {**fitted.path.to_dict(), "linear": fitted.line.to_dict()})
        click.echo(f"wrote {json_path}")
    if plot_path:
        from lmckit.measure._plot import plot_paths

        plot_paths({"linear": fitted.line, kind: fitted.path}, plot_path)
        click.echo(f"wrote {plot_path}")
