"""``lmckit merge``: the interpolated model, optionally with BatchNorm reset or REPAIR."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
import torch
from torch import Tensor

from lmckit.checkpoint import save
from lmckit.cli.common import (
    check_out_dir,
    data_option,
    dtype_option,
    fail,
    force_option,
    input_paths,
    load_dataset,
    load_models,
    model_pair_arguments,
    output_dtype,
    set_threads,
    threads_option,
)
from lmckit.io import model_format, save_model
from lmckit.measure import evaluate_split
from lmckit.models import ZooModel
from lmckit.outputs import OutputKind
from lmckit.params import check_compatible
from lmckit.streamed import LinearPoint
from lmckit.workflow import merge_pair, path_form, recorded_form

__all__ = ["command"]


@click.command("merge")
@model_pair_arguments
@click.option(
    "--t", "t", type=float, default=0.5, show_default=True, help="Weight of B: (1 - t) A + t B."
)
@click.option("--reset-bn", is_flag=True, help="Recompute BatchNorm statistics on --data.")
@click.option(
    "--repair",
    "do_repair",
    is_flag=True,
    help="REPAIR: match channel statistics to the interpolated endpoints'.",
)
@click.option(
    "--circuits/--no-circuits",
    default=None,
    help="Transformers: interpolate heads as QK/OV circuits (written as an lmckit "
    "checkpoint), or not. Default: as `lmckit align` recorded in the aligned model.",
)
@data_option
@click.option("--out", type=click.Path(file_okay=False), required=True)
@dtype_option
@force_option
@threads_option
def command(
    model_a: str,
    model_b: str,
    t: float,
    reset_bn: bool,
    do_repair: bool,
    circuits: bool | None,
    data_spec: str | None,
    out: str,
    dtype: str,
    force: bool,
    threads: int | None,
) -> None:
    """Interpolate MODEL_A and MODEL_B (align B first with `lmckit align`), in their format."""
    kind = merge_output_kind(model_a, model_b, circuits)
    inputs = input_paths(model_a, model_b, data_spec=data_spec)
    check_out_dir(out, kind, inputs, force)
    set_threads(threads)
    if reset_bn and do_repair:
        raise fail("choose one of --reset-bn and --repair (REPAIR resets BatchNorm itself)")
    if not 0.0 <= t <= 1.0:
        raise fail(f"--t must lie in [0, 1], got {t}")
    fix = "repair" if do_repair else "reset_bn" if reset_bn else "none"
    # a plain average is summed in float32 tensor by tensor and rounded once: models
    # written back in their own dtype stay in it (half the memory for bfloat16)
    native = fix == "none" and data_spec is None and dtype == "auto"
    a, b = load_models([model_a, model_b], forms=True, dtype=None if native else torch.float32)
    form = path_form(a, b, circuits=circuits)
    if (kind == "hf") != form.same_as_a:
        check_out_dir(out, "hf" if form.same_as_a else "checkpoint", inputs, force)
    # written in A's format when the form is A's own architecture
    stored = output_dtype(dtype, a.format if form.same_as_a else "checkpoint")
    if form.note:
        click.echo(f"form (as `lmckit align` recorded): {form.note}")
    data = load_dataset(data_spec) if (fix != "none" or data_spec) else None
    merged: Mapping[str, Tensor]
    if data is None:
        # the plain average, computed tensor by tensor as it is written (no third model)
        check_compatible(form.a, form.b)
        merged = LinearPoint(form.a, form.b, t, None)
    else:
        merged = merge_pair(form.module, form.a, form.b, t=t, fix=fix, data=data)
    meta: dict[str, Any] = {
        "a": model_a,
        "b": model_b,
        "t": t,
        "reset_bn": reset_bn,
        "repair": do_repair,
        "data": data_spec,
        "circuits": form.circuits,
    }
    if form.choice is not None:
        meta["form_choice"] = form.choice.to_dict()
    if data is not None:
        m = evaluate_split(form.module, dict(merged), data)
        meta.update(test_loss=m.loss, test_acc=m.acc)
        click.echo(f"merged model: test loss {m.loss:.4f}, accuracy {100 * m.acc:.2f}%")
    # the writers check --out again: with the --force the command checked it with above
    if form.same_as_a:
        # the weights derive from both: the card carries B's license beside A's
        save_model(out, a, merged, metadata=meta, dtype=stored, sources=[model_b], overwrite=force)
    else:
        assert isinstance(form.module, ZooModel)  # a form of lmckit's own model
        save(out, form.module, dict(merged), metadata=meta, overwrite=force)
    click.echo(f"wrote {out}")


def merge_output_kind(model_a: str, model_b: str, circuits: bool | None) -> OutputKind:
    """What ``merge`` writes, read before loading: A's format, unless the recorded form
    (or ``--circuits``) is lmckit's own model."""
    choice = recorded_form(model_b) or recorded_form(model_a)
    zoo = circuits or (
        circuits is None and choice is not None and (choice.to_zoo or choice.path_circuits)
    )
    return "hf" if model_format(model_a) == "hf" and not zoo else "checkpoint"
