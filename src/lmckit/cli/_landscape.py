"""``lmckit landscape``: loss and accuracy on the plane through three models."""

from __future__ import annotations

from pathlib import Path

import click
import torch

from lmckit.cli._common import (
    check_out_files,
    choice_option,
    data_option,
    fail,
    input_paths,
    join_processes,
    load_dataset,
    load_models,
    quiet_option,
    set_threads,
    threads_option,
)
from lmckit.formats._curve_folder import is_curve_folder
from lmckit.formats._io import LoadedModel
from lmckit.measure._measure import EvalSettings
from lmckit.outputs._atomic import write_json
from lmckit.paths._plane import MAX_PLANE_RESOLUTION
from lmckit.workflow._curves import CURVE_FIXES, LoadedCurve, load_curve
from lmckit.workflow._landscape import pair_landscape, plane_inputs

__all__ = ["command"]


@click.command("landscape")
@click.argument("model_a", type=click.Path(exists=True))
@click.argument("model_b", type=click.Path(exists=True))
@click.argument("third", metavar="C", type=click.Path(exists=True))
@data_option
@click.option(
    "--resolution",
    type=int,
    default=21,
    show_default=True,
    help=f"Grid points per axis (2 to {MAX_PLANE_RESOLUTION}).",
)
@click.option(
    "--margin",
    type=float,
    default=0.2,
    show_default=True,
    help="How far the grid reaches beyond the models, as a fraction of their extent.",
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
    help="Transformers: the plane's form; default: as `lmckit align` recorded.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), required=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), required=True)
@threads_option
@quiet_option
def command(
    model_a: str,
    model_b: str,
    third: str,
    data_spec: str | None,
    resolution: int,
    margin: float,
    split: str,
    fix: str,
    circuits: bool | None,
    json_path: str,
    plot_path: str,
    threads: int | None,
    quiet: bool,
) -> None:
    """Loss and accuracy on the plane through MODEL_A, MODEL_B and C: a third model, or a
    curve folder written by `lmckit curve` (the plane of A, B and its middle control
    point, the curve drawn)."""
    writer = join_processes()  # under torchrun: process 0 reports and writes
    quiet = quiet or not writer
    set_threads(threads)
    if not 2 <= resolution <= MAX_PLANE_RESOLUTION:
        raise fail(
            f"--resolution must be between 2 and {MAX_PLANE_RESOLUTION} points per "
            f"axis, got {resolution}"
        )
    if not margin >= 0:
        raise fail(f"--margin must be >= 0, got {margin}")
    inputs = input_paths(model_a, model_b, third, data_spec=data_spec)
    if writer:
        check_out_files(inputs, json=json_path, plot=plot_path)
    curve = is_curve_folder(third)
    settings = EvalSettings(split=split, fix=fix, dtype=torch.float32)
    data = load_dataset(data_spec)
    loaded = load_models([model_a, model_b] if curve else [model_a, model_b, third], forms=True)
    c: LoadedModel | LoadedCurve = load_curve(third, loaded[0], loaded[1]) if curve else loaded[2]
    inputs3 = plane_inputs(loaded[0], loaded[1], c, circuits=circuits)
    labels = [
        Path(model_a).name,
        Path(model_b).name,
        f"{Path(third).name} (middle point)" if curve else Path(third).name,
    ]
    result = pair_landscape(
        inputs3,
        data,
        settings,
        resolution=resolution,
        margin=margin,
        labels=labels,
        meta={"data": data_spec, "models": [model_a, model_b, third]},
        progress=not quiet,
    )
    if inputs3.form.note:
        click.echo(f"form (as `lmckit align` recorded): {inputs3.form.note}")
    for m in result.models:
        click.echo(
            f"{m['path']}: at ({m['xy'][0]:.3f}, {m['xy'][1]:.3f}), loss {m['loss']:.4f} "
            f"(plane {m['plane_loss']:.4f}), acc {100 * m['acc']:.2f}%"
        )
    flat = [v for row in result.loss for v in row]
    click.echo(f"grid {resolution}x{resolution}: loss {min(flat):.4f} to {max(flat):.4f}")
    if not writer:
        return
    write_json(json_path, result.to_dict())
    click.echo(f"wrote {json_path}")
    from lmckit.measure._plot import plot_planes

    plot_planes({f"plane through {', '.join(labels)}": result}, plot_path)
    click.echo(f"wrote {plot_path}")
