"""``lmckit ensemble``: the averaged outputs of points along a trained curve."""

from __future__ import annotations

import click
import torch

from lmckit.cli._common import (
    check_out_files,
    choice_option,
    data_option,
    input_paths,
    join_processes,
    load_dataset,
    quiet_option,
    set_threads,
    threads_option,
)
from lmckit.measure._evaluate import Metrics
from lmckit.measure._measure import EvalSettings
from lmckit.measure._table import Column, format_table, percent
from lmckit.outputs._atomic import write_json
from lmckit.paths._ensemble import COMBINES
from lmckit.workflow._curves import CURVE_FIXES, load_curve
from lmckit.workflow._landscape import curve_ensemble

__all__ = ["command"]

_COLUMNS = (
    Column("model", "model", align="<"),
    Column("loss", "loss", ".4f"),
    percent("acc", "acc"),
)


@click.command("ensemble")
@click.argument("curve", type=click.Path(exists=True, file_okay=False))
@data_option
@click.option(
    "--points",
    type=click.IntRange(2, 1000),
    default=5,
    show_default=True,
    help="Points of the curve averaged, evenly spaced, both endpoints included.",
)
@choice_option(
    "--combine", COMBINES, "logits", "Average the members' logits, or their softmax probabilities."
)
@choice_option("--split", ["test", "train"], "test")
@choice_option(
    "--fix",
    CURVE_FIXES,
    "auto",
    "Fix at each point: auto resets BatchNorm statistics where there are any.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@threads_option
@quiet_option
def command(
    curve: str,
    data_spec: str | None,
    points: int,
    combine: str,
    split: str,
    fix: str,
    json_path: str | None,
    threads: int | None,
    quiet: bool,
) -> None:
    """Ensemble of --points points along CURVE (a folder written by `lmckit curve`; its
    endpoints are read from where it recorded them), beside each endpoint, the ensemble
    of the two endpoints and their uniform soup."""
    writer = join_processes()  # under torchrun: process 0 reports and writes
    quiet = quiet or not writer
    set_threads(threads)
    inputs = input_paths(curve, data_spec=data_spec)
    if writer:
        check_out_files(inputs, json=json_path)
    else:
        json_path = None
    data = load_dataset(data_spec)
    loaded = load_curve(curve)
    settings = EvalSettings(split=split, fix=fix, dtype=torch.float32)
    result = curve_ensemble(
        loaded,
        data,
        settings,
        points=points,
        combine=combine,
        meta={"data": data_spec},
        progress=not quiet,
    )
    ends = [e.path for e in loaded.record.endpoints]
    rows: list[tuple[str, Metrics]] = [
        (f"curve ensemble ({points} points)", result.ensemble),
        (f"A ({ends[0]})", result.endpoints[0]),
        (f"B ({ends[1]})", result.endpoints[1]),
        ("ensemble of A and B", result.pair_ensemble),
        ("uniform soup of A and B", result.soup),
    ]
    click.echo(
        format_table(
            [{"model": n, "loss": m.loss, "acc": m.acc} for n, m in rows],
            _COLUMNS,
            title=f"{loaded.curve.kind} curve, {split} split",
        )
    )
    if json_path:
        write_json(json_path, result.to_dict())
        click.echo(f"wrote {json_path}")
