"""``lmckit barrier``: loss and accuracy along the path between two models, or a simplex."""

from __future__ import annotations

from pathlib import Path

import click
import torch

from lmckit.cli._common import (
    POSITIVE,
    check_out_files,
    choice_option,
    data_option,
    fail,
    force_option,
    input_paths,
    join_processes,
    load_dataset,
    load_models,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
    write_json_output,
)
from lmckit.measure._measure import FIXES, EvalSettings, path_table
from lmckit.paths._simplex import check_simplex_size
from lmckit.workflow import pair_barrier, simplex_barrier
from lmckit.workflow._simplex import check_simplex_request

__all__ = ["command"]


@click.command("barrier")
@click.argument("models", nargs=-1, required=True, type=click.Path(exists=True))
@data_option
@click.option(
    "--points",
    type=int,
    default=11,
    show_default=True,
    help="Points on the path, both ends included: an odd number (3 to 10,001), so that "
    "t = 0.5 is one of them.",
)
@choice_option("--split", ["test", "train"], "test")
@choice_option(
    "--fix",
    FIXES,
    "auto",
    "Fix at each point: auto resets BatchNorm statistics where there are any.",
)
@click.option(
    "--simplex",
    is_flag=True,
    help="Several models: loss over the simplex they span and the multi-model barrier.",
)
@click.option(
    "--resolution",
    type=POSITIVE,
    default=12,
    show_default=True,
    help="With --simplex: grid step 1/R in each convex weight (R >= 2; the centroid is a "
    "grid point, and its loss reported, when R is a multiple of the number of models).",
)
@click.option(
    "--align",
    "align_method",
    type=click.Choice(["none", "weight"]),
    default="none",
    show_default=True,
    help="With --simplex: weight: universe matching of all models into one frame first.",
)
@seed_option("With --align weight.")
@click.option(
    "--head-bases",
    is_flag=True,
    help="With --align weight, transformers: also align every model's attention-head bases "
    "to the first model's.",
)
@click.option(
    "--circuits/--no-circuits",
    default=None,
    help="Transformers: interpolate (and align) the models with every head rewritten as its "
    "QK/OV circuit (exact at the ends; the path is the paper's), or not. Default: as "
    "`lmckit align` recorded in the aligned model (its form), else not.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write the result as JSON here; '-' writes it to stdout (for jq), and the table "
    "to stderr.",
)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Draw it here.")
@force_option
@threads_option
@quiet_option
def command(
    models: tuple[str, ...],
    data_spec: str | None,
    points: int,
    split: str,
    fix: str,
    simplex: bool,
    resolution: int,
    align_method: str,
    seed: int,
    head_bases: bool,
    circuits: bool | None,
    json_path: str | None,
    plot_path: str | None,
    force: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Loss and accuracy along the linear path from MODEL_A to MODEL_B.

    With --simplex, MODELS are two or more checkpoints and the loss is measured over
    the simplex they span (multi-model barrier; --plot draws it for three).
    """
    writer = join_processes()  # under torchrun: process 0 reports and writes
    quiet = quiet or not writer
    set_threads(threads)
    if not simplex and len(models) != 2:
        raise fail(f"give two models (or --simplex for several), got {len(models)}")
    if not simplex and (align_method != "none" or head_bases):
        raise fail("--align and --head-bases are for --simplex; align a pair with "
                   "`lmckit align` first")  # fmt: skip
    if simplex:
        check_simplex_request(len(models), align=align_method, head_bases=head_bases,
                              circuits=bool(circuits), fix=fix)  # fmt: skip
    if simplex and plot_path and len(models) != 3:
        raise fail(f"--plot draws the simplex of 3 models, got {len(models)}")
    inputs = input_paths(*models, data_spec=data_spec)
    if writer:
        check_out_files(inputs, json=json_path, plot=plot_path, force=force)
    else:  # the other processes compute, and write nothing
        json_path = plot_path = None
    # bfloat16 or float16 models stay as stored; each point is built in float32
    settings = EvalSettings(split=split, points=points, fix=fix, dtype=torch.float32)
    if simplex:
        check_simplex_size(len(models), resolution)
        _simplex(models, data_spec, settings, resolution=resolution, align=align_method,
                 seed=seed, head_bases=head_bases, circuits=bool(circuits), json_path=json_path,
                 plot_path=plot_path, quiet=quiet, force=force)  # fmt: skip
        return
    data = load_dataset(data_spec)
    a, b = load_models(models, forms=True, dtype=None)
    if any(v.dtype == torch.float64 for m in (a, b) for v in m.params.values()):
        # read as float32 like every point, refusing by name a value float32 cannot hold
        a, b = load_models(models, forms=True)
    meta = {"a": models[0], "b": models[1], "data": data_spec, "circuits": circuits}
    result = pair_barrier(a, b, data, settings, circuits=circuits, meta=meta, progress=not quiet)
    if result.meta.get("form"):
        click.echo(f"form (as `lmckit align` recorded): {result.meta['form']}")
    click.echo(path_table({"linear": result}))
    if json_path:
        write_json_output(json_path, result.to_dict())
    if plot_path:
        from lmckit.measure._plot import plot_paths

        plot_paths({"linear": result}, plot_path, overwrite=force)
        click.echo(f"wrote {plot_path}")


def _simplex(
    paths: tuple[str, ...],
    data_spec: str | None,
    settings: EvalSettings,
    *,
    resolution: int,
    align: str,
    seed: int,
    head_bases: bool,
    circuits: bool,
    json_path: str | None,
    plot_path: str | None,
    quiet: bool,
    force: bool,
) -> None:
    """The multi-model barrier over the simplex spanned by ``paths``."""
    data = load_dataset(data_spec)
    ckpts = load_models(paths)
    result = simplex_barrier(
        ckpts,
        data,
        settings,
        resolution=resolution,
        align=align,
        head_bases=head_bases,
        circuits=circuits,
        seed=seed,
        meta={"models": list(paths), "data": data_spec},
        progress=not quiet,
    )
    vertices = "/".join(f"{v:.4f}" for v in result.vertex_loss)
    centroid = (
        f"centroid loss {result.centroid_loss:.4f}"
        if result.has_centroid
        else f"no centroid on this grid (--resolution {resolution} is not a multiple of {result.k})"
    )
    click.echo(
        f"simplex of {result.k} models ({len(result.weights)} points, align {align}): "
        f"loss barrier {result.barrier_loss:.4f}, accuracy barrier "
        f"{100 * result.barrier_acc:.2f}%, {centroid}, vertex losses {vertices}"
    )
    if json_path:
        write_json_output(json_path, result.to_dict())
    if plot_path:
        from lmckit.measure._plot import plot_simplex

        labels = tuple(Path(p).name for p in paths)
        plot_simplex({f"align: {align}": result}, plot_path, labels=labels, overwrite=force)
        click.echo(f"wrote {plot_path}")
