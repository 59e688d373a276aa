"""``lmckit align``: B aligned to A under the architecture's symmetries, in B's format."""

from __future__ import annotations

from typing import Any

import click
import torch

from lmckit.aligners._weight import START_OPTIONS
from lmckit.cli._common import (
    DTYPES,
    POSITIVE,
    check_out_dir,
    choice_option,
    count_option,
    data_option,
    dtype_option,
    force_option,
    input_paths,
    join_processes,
    load_dataset,
    model_pair_arguments,
    parse_device,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
    validate_data_spec,
)
from lmckit.cli._flags import flag_spelling
from lmckit.formats._io import load, output_kind_of
from lmckit.forms._choice import FORMS, FormChoice
from lmckit.forms._recipe import SYMMETRIES
from lmckit.plan import AlignPlan, AlignRequest, plan_alignment, write_aligned
from lmckit.plan._align import aligned_result
from lmckit.plan._aligned import Aligned
from lmckit.plan._request import ALIGN_METHODS, method_info
from lmckit.plan._write import WrittenFiles
from lmckit.runtime._distributed import is_distributed

__all__ = ["command"]


@click.command("align")
@model_pair_arguments
@choice_option(
    "--method",
    list(ALIGN_METHODS),
    "weight",
    "learned: learned matching, started from weight matching (needs --data).",
)
@choice_option(
    "--symmetry",
    SYMMETRIES,
    None,
    "permutation: orthogonal spaces become permutations; orthogonal: residual stream "
    "by an orthogonal map (LayerNorm transformers are rewritten to RMSNorm first). "
    "Default: the architecture's own groups.",
)
@choice_option(
    "--start",
    ["auto", *START_OPTIONS],
    "auto",
    "Weight matching: anchored solves each space outward from what the models share "
    "(inputs, tokens, classes) first; identity starts from the identity; "
    "best runs both and keeps the one whose midpoint has the lower loss on --data's "
    "training split (up to 32,768 labels or tokens); auto: best with --data, else anchored.",
)
@click.option(
    "--max-sweeps",
    "max_iter",
    type=POSITIVE,
    default=100,
    show_default=True,
    help="Weight matching: sweep limit of its coordinate descent.",
)
@count_option("--steps", 500, "Learned matching: max steps.")
@click.option(
    "--lr", type=float, default=0.01, show_default=True, help="Learned matching: AdamW rate."
)
@count_option("--batch-size", 128, "Learned matching: training blocks or examples per step.")
@click.option(
    "--max-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Learned matching: stop after this much wall time (the best transform so far).",
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Learned matching: torch device for its forward and backward passes, e.g. cuda.",
)
@click.option(
    "--head-bases",
    is_flag=True,
    help="Transformers: after the transform, align each matched head's query/key and "
    "value/output bases by orthogonal maps (data-free; the function is unchanged; "
    "projected form).",
)
@click.option(
    "--circuits/--no-circuits",
    default=None,
    help="Transformers: rewrite both models' heads as QK/OV circuits first (exact) and "
    "align and interpolate in that form (a Hugging Face folder is still written in its "
    "class, the form recorded for barrier and merge), or keep heads as projections. "
    "Default: the form measured best for the method and symmetry, said in one line.",
)
@click.option(
    "--mask-unseen/--no-mask-unseen",
    default=True,
    show_default=True,
    help="With token --data: leave the embedding and output rows of tokens that never "
    "occur in the training split out of weight matching.",
)
@data_option
@click.option(
    "--out", type=click.Path(file_okay=False), required=True, help="Directory for B aligned to A."
)
@dtype_option
@seed_option()
@force_option
@threads_option
@quiet_option
def command(model_a: str, model_b: str, method: str, symmetry: str | None, circuits: bool | None,
            head_bases: bool, mask_unseen: bool, data_spec: str | None, out: str, dtype: str,
            seed: int, force: bool, threads: int | None, quiet: bool, device: str,
            **options: Any) -> None:  # fmt: skip
    """Align MODEL_B to MODEL_A under the architecture's symmetries; write the result.

    With --data, weight matching also uses it: the start whose midpoint has the lower
    training loss, and masks of the tokens that never occur.
    """
    writer = join_processes()  # under torchrun: process 0 reports and writes
    quiet = quiet or not writer
    request = AlignRequest(method=method, symmetry=symmetry, circuits=circuits,
                           head_bases=head_bases, options=_given(method, options),
                           mask_unseen=mask_unseen, seed=seed, has_data=data_spec is not None,
                           dtype=DTYPES[dtype])  # fmt: skip
    info, _ = request.checked()
    validate_data_spec(data_spec)  # cheap: before any model is loaded
    inputs = input_paths(model_a, model_b, data_spec=data_spec)
    if writer:
        check_out_dir(out, output_kind_of(model_b), inputs, force)
    set_threads(threads)
    torch_device = parse_device(device)
    read_as, checked = _reading(info.name, data_spec, dtype)
    a = load(model_a, dtype=read_as, check_values=checked)
    plan = plan_alignment(a, request)
    for line in plan.describe():
        click.echo(line.render(flag_spelling(click.get_current_context().command)))
    b = load(model_b, like=a, dtype=read_as, check_values=checked)
    data = load_dataset(data_spec) if data_spec else None
    pair = plan.run(b, data, device=torch_device, progress=not quiet)
    if not writer:
        return
    aligned = aligned_result(pair, a, b, {}, data_spec)
    if aligned.written.like.output_kind != plan.output.kind:
        check_out_dir(out, aligned.written.like.output_kind, inputs, force)
    files = write_aligned(aligned, out, overwrite=force, dtype=plan.output.dtype,
                          inputs=inputs)  # fmt: skip
    _report(aligned, plan, files)


def _reading(method: str, data_spec: str | None, dtype: str) -> tuple[torch.dtype | None, bool]:
    """How the models are read: weight matching reads the weights as float32 one tensor
    at a time, so models written back in their own dtype stay in it (half the memory of
    float32 copies for bfloat16); across processes each checks the values of the tensors
    it works on (weight matching refuses a NaN by name), so that none reads the parts
    of the models it leaves alone."""
    native = method == "weight_matching" and data_spec is None and dtype == "auto"
    return (None if native else torch.float32), not (native and is_distributed())


def _report(aligned: Aligned, plan: AlignPlan, files: WrittenFiles) -> None:
    """What the run did, in a few lines: the form, the objective, masks, the start, the
    files written."""
    result, meta = aligned.result, aligned.metadata
    choice = FormChoice.from_dict(meta["form_choice"])
    assert choice is not None  # the plan always says which form it took
    if "form_midpoint_losses" in meta:  # the form was chosen on --data
        midpoints = meta["form_midpoint_losses"].items()
        losses = ", ".join(f"{FORMS[k].label} {v:.4g}" for k, v in midpoints)
        click.echo(f"form: {choice.form.label} (lower midpoint training loss: {losses})")
    elif plan.chosen_on_data:
        spelling = flag_spelling(click.get_current_context().command)
        click.echo(choice.described().render(spelling))
    click.echo(result.summary())
    for line in aligned.left_out:  # checked on B: the spec was inferred on A
        click.echo(f"left out: {line}")
    if "masked_rows" in meta:
        rows = max(meta["masked_rows"].values())
        click.echo(f"masked {rows} token rows that never occur in the training split")
    if "start" in meta:  # the start was chosen on --data
        click.echo(f"start: {meta['start']['chosen']} (lower midpoint training loss)")
    if result.stop and result.iteration_unit == "sweeps":
        click.echo(f"warning: weight matching stopped early: {result.stop}; raise --max-sweeps",
                   err=True)  # fmt: skip
    click.echo(f"wrote {files.model}")
    if files.note:
        click.echo(f"note: {files.note}")
    if files.reference is not None:
        lifted = aligned.written.record.get("stored_form") == "class"
        what = "as B is written, its norm scales folded" if lifted else f"in {aligned.form}"
        click.echo(f"wrote {files.reference} (MODEL_A {what}: measure barriers against it)")


def _given(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """The method options given on the command line, each refused (in one line) for a
    method that does not declare it (:attr:`lmckit.aligners.AlignerInfo.options`)."""
    ctx = click.get_current_context()
    given = {k: v for k, v in options.items()
             if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}  # fmt: skip
    declared = method_info(method).options
    for name in sorted(set(given) - set(declared)):
        owners = [m for m in ALIGN_METHODS if name in method_info(m).options]
        flag = next(p.opts[0] for p in ctx.command.params if p.name == name)
        raise click.ClickException(
            f"{flag} is an option of --method {' and '.join(owners)}; --method {method} "
            "does not use it"
        )
    return given
