"""``lmckit merge``: the interpolated model, optionally with BatchNorm reset or REPAIR."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
import torch
from torch import Tensor

from lmckit.cli._common import (
    DTYPES,
    check_out_dir,
    data_option,
    dtype_option,
    fail,
    force_option,
    input_paths,
    load_dataset,
    load_models,
    model_pair_arguments,
    set_threads,
    threads_option,
)
from lmckit.formats._io import output_kind_of, save_model
from lmckit.formats._loaded import check_output_dtype
from lmckit.forms._choice import point_has_circuits, written_kind
from lmckit.measure._measure import evaluate_split
from lmckit.measure._streamed import LinearPoint
from lmckit.merging._methods import check_t
from lmckit.outputs import OutputKind
from lmckit.symmetry._params import check_compatible
from lmckit.workflow import merge_pair
from lmckit.workflow._pair import path_form, recorded_form, written_point

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
    "checkpoint: no class of projected heads holds the point), or not. Default: as "
    "`lmckit align` recorded in the aligned model.",
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
    if reset_bn and do_repair:
        raise fail("choose one of --reset-bn and --repair (REPAIR resets BatchNorm itself)")
    check_t(t)
    kind = merge_output_kind(model_a, model_b, circuits)
    inputs = input_paths(model_a, model_b, data_spec=data_spec)
    check_out_dir(out, kind, inputs, force)
    check_output_dtype(DTYPES[dtype], kind)
    set_threads(threads)
    fix = "repair" if do_repair else "reset_bn" if reset_bn else "none"
    # a plain average is summed in float32 tensor by tensor and rounded once: models
    # written back in their own dtype stay in it (half the memory for bfloat16)
    native = fix == "none" and data_spec is None and dtype == "auto"
    a, b = load_models([model_a, model_b], forms=True, dtype=None if native else torch.float32)
    form = path_form(a, b, circuits=circuits)
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
    meta: dict[str, Any] = {"a": model_a, "b": model_b, "t": t, "reset_bn": reset_bn,
                            "repair": do_repair, "data": data_spec,
                            "circuits": form.circuits}  # fmt: skip
    if form.choice is not None:
        meta["form_choice"] = form.choice.to_dict()
    if data is not None:
        m = evaluate_split(form.module, dict(merged), data)
        meta.update(test_loss=m.loss, test_acc=m.acc)
        click.echo(f"merged model: test loss {m.loss:.4f}, accuracy {100 * m.acc:.2f}%")
    like, params, note = written_point(a, form, merged)
    if like.output_kind != kind:
        check_out_dir(out, like.output_kind, inputs, force)
    # the weights derive from both: a card carries B's license beside A's
    save_model(out, like, params, metadata=meta, dtype=DTYPES[dtype], sources=[model_b],
               overwrite=force)  # fmt: skip
    click.echo(f"wrote {out}")
    if note:
        click.echo(f"note: {note}")


def merge_output_kind(model_a: str, model_b: str, circuits: bool | None) -> OutputKind:
    """What ``merge`` writes, read before loading: A's kind, unless the point's heads are
    QK/OV circuits (:func:`lmckit.forms._choice.written_kind`)."""
    choice = recorded_form(model_b) or recorded_form(model_a)
    return written_kind(output_kind_of(model_a), circuit_heads=point_has_circuits(choice, circuits))
