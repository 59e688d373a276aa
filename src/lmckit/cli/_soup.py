"""``lmckit soup``: the uniform or greedy soup of several models, in their format."""

from __future__ import annotations

from pathlib import Path

import click
import torch

from lmckit.cli._common import (
    check_out_dir,
    choice_option,
    data_option,
    fail,
    force_option,
    input_paths,
    load_dataset,
    load_models,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
)
from lmckit.formats._io import model_format, save_model
from lmckit.measure._measure import EvalSettings
from lmckit.measure._table import Column, format_table, percent
from lmckit.workflow._curves import CURVE_FIXES
from lmckit.workflow._soup import SOUP_ALIGNS, make_soup

__all__ = ["command"]

_COLUMNS = (
    Column("model", "model", align="<"),
    Column("in soup", "member", align="<"),
    Column("loss", "loss", ".4f"),
    percent("acc", "acc"),
)


@click.command("soup")
@click.argument("models", nargs=-1, required=True, type=click.Path(exists=True))
@data_option
@click.option(
    "--greedy",
    is_flag=True,
    help="Greedy soup: add models best first while the held-out accuracy does not "
    "drop (chosen on the validation split, else the training split).",
)
@choice_option(
    "--align",
    SOUP_ALIGNS,
    "none",
    "weight: weight-match every model to the first before averaging.",
)
@choice_option(
    "--split", ["test", "train"], "test", "Split the soup and its models are reported on."
)
@choice_option(
    "--fix",
    CURVE_FIXES,
    "auto",
    "Fix of an average: auto resets BatchNorm statistics where there are any.",
)
@seed_option("With --align weight.")
@click.option("--out", type=click.Path(file_okay=False), required=True)
@force_option
@threads_option
@quiet_option
def command(
    models: tuple[str, ...],
    data_spec: str | None,
    greedy: bool,
    align: str,
    split: str,
    fix: str,
    seed: int,
    out: str,
    force: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Average MODELS (two or more of one architecture) into one model, written to --out in
    the first model's format."""
    set_threads(threads)
    if len(models) < 2:
        raise fail(f"a soup needs at least two models, got {len(models)}")
    inputs = input_paths(*models, data_spec=data_spec)
    check_out_dir(out, "hf" if model_format(models[0]) == "hf" else "checkpoint", inputs, force)
    loaded = load_models(models)
    data = load_dataset(data_spec)
    settings = EvalSettings(split=split, fix=fix, dtype=torch.float32)
    result = make_soup(
        loaded, data, settings, greedy=greedy, align=align, seed=seed, progress=not quiet
    )
    rows = [
        {
            "model": Path(p).name,
            "member": "yes" if i in result.members else "no",
            "loss": m.loss,
            "acc": m.acc,
        }
        for i, (p, m) in enumerate(zip(models, result.ingredients, strict=True))
    ]
    kind = "greedy" if greedy else "uniform"
    rows.append(
        {
            "model": f"{kind} soup",
            "member": f"{len(result.members)} model{'s' if len(result.members) > 1 else ''}",
            "loss": result.soup.loss,
            "acc": result.soup.acc,
        }
    )
    click.echo(format_table(rows, _COLUMNS, title=f"{split} split, align {align}"))
    meta = {
        "soup": kind,
        "models": list(models),
        "members": [models[i] for i in result.members],
        "data": data_spec,
        "test_loss": result.soup.loss,
        "test_acc": result.soup.acc,
        **result.meta,
    }
    save_model(out, loaded[0], result.params, metadata=meta, overwrite=force)
    click.echo(f"wrote {out}")
