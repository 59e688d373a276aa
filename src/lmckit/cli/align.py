"""``lmckit align``: B aligned to A under the architecture's symmetries, in B's format."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import click
import torch
from torch import Tensor, nn

from lmckit.aligners.weight import START_OPTIONS
from lmckit.checkpoint import save
from lmckit.cli.common import (
    check_out_dir,
    choice_option,
    count_option,
    data_option,
    dtype_option,
    force_option,
    input_paths,
    join_processes,
    load_dataset,
    load_like,
    load_models,
    model_pair_arguments,
    output_dtype,
    parse_device,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
    validate_data_spec,
)
from lmckit.distributed import is_distributed
from lmckit.io import LoadedModel, model_format, save_model
from lmckit.models import ZooModel
from lmckit.outputs import REFERENCE_DIR, OutputKind
from lmckit.recipe import SYMMETRIES, spec_of
from lmckit.workflow import (
    ALIGN_METHODS,
    AlignedPair,
    align_models,
    align_output_kind,
    choose_pair_form,
)

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
@count_option("--max-sweeps", 100, "Weight matching: sweep limit of its coordinate descent.")
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
    "align and interpolate in that form (written as lmckit checkpoints), or keep heads "
    "as projections. Default: the form measured best for the method and symmetry, "
    "said in one line.",
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
def command(
    model_a: str,
    model_b: str,
    method: str,
    symmetry: str | None,
    start: str,
    max_sweeps: int,
    steps: int,
    lr: float,
    batch_size: int,
    max_seconds: float | None,
    device: str,
    head_bases: bool,
    circuits: bool | None,
    mask_unseen: bool,
    data_spec: str | None,
    out: str,
    dtype: str,
    seed: int,
    force: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Align MODEL_B to MODEL_A under the architecture's symmetries; write the result.

    With --data, weight matching also uses it: the start whose midpoint has the lower
    training loss, and masks of the tokens that never occur.
    """
    from lmckit.aligners import LearnedMatchingConfig, WeightMatchingConfig, aligner_info
    from lmckit.workflow.align import ALIGN_METHODS

    writer = join_processes()  # under torchrun: process 0 reports and writes
    quiet = quiet or not writer
    inputs = input_paths(model_a, model_b, data_spec=data_spec)
    if writer:
        check_out_dir(out, output_kind(model_b), inputs, force)
    set_threads(threads)
    if circuits and head_bases:
        raise click.ClickException("--head-bases aligns bases inside heads; --circuits leaves none")
    if start == "best" and data_spec is None:
        raise click.ClickException("--start best compares the starts on training data: give --data")
    _refuse_unused_options(method)
    if data_spec is None and aligner_info(ALIGN_METHODS[method]).needs_data:
        raise click.ClickException(f"--method {method} reads data: give --data")
    validate_data_spec(data_spec)  # cheap: before any model is loaded
    config: LearnedMatchingConfig | WeightMatchingConfig | None = None
    if method == "learned":
        config = LearnedMatchingConfig(
            steps=steps, lr=lr, batch_size=batch_size, max_seconds=max_seconds
        )
    elif method == "weight":
        chosen = start if start != "auto" else "best" if data_spec else "anchored"
        config = WeightMatchingConfig(start=chosen, max_iter=max_sweeps)
    torch_device = parse_device(device)
    # weight matching reads the weights as float32 one tensor at a time: models written
    # back in their own dtype stay in it (half the memory of float32 copies for bfloat16)
    native = method == "weight" and data_spec is None and dtype == "auto"
    read_as = None if native else torch.float32
    # across processes each checks the values of the tensors it works on (weight matching
    # refuses a NaN by name), so that none reads the parts of the models it leaves alone
    checked = not (native and is_distributed())
    (a,) = load_models([model_a], dtype=read_as, check_values=checked)
    choice = choose_pair_form(
        a, method=method, symmetry=symmetry, circuits=circuits, head_bases=head_bases
    )
    # A's spec is inferred (and checked: on a float64 copy of a model up to 134M
    # parameters) before B is read, so that copy never sits beside both models
    spec = None if choice.to_zoo else spec_of(a.module)
    b = load_like(a, model_b, dtype=read_as, check_values=checked)
    kind = align_output_kind(b, choice)
    if writer and kind != output_kind(model_b):
        check_out_dir(out, kind, inputs, force)  # the form is written as lmckit's model
    stored = output_dtype(dtype, kind)
    if circuits is not None or data_spec is None or method != "weight":
        click.echo(choice.describe())
    data = load_dataset(data_spec) if data_spec else None
    aligned = align_models(
        a,
        b,
        method=method,
        symmetry=symmetry,
        circuits=circuits,
        head_bases=head_bases,
        data=data,
        mask_unseen=mask_unseen,
        seed=seed,
        config=config,
        device=torch_device,
        progress=not quiet,
        spec=spec,
    )
    if not writer:
        return
    metadata = {"aligned_to": str(model_a), "source": str(model_b), **aligned.metadata}
    metadata["data"] = data_spec
    reference = str(Path(out) / REFERENCE_DIR) if aligned.reference is not None else None
    if reference is not None:
        # B is written in the form it was aligned in: A's same form is the reference
        metadata["reference"] = reference
    _write(out, b, aligned.module, aligned.params, aligned.same_architecture, metadata, force,
           dtype=stored)  # fmt: skip
    if reference is not None and aligned.reference is not None:
        meta = {"rewritten_from": str(model_a), "form": aligned.form,
                "form_choice": aligned.metadata["form_choice"]}  # fmt: skip
        # inside the folder just written, so new: nothing to force
        _write(reference, a, aligned.module, aligned.reference, aligned.same_architecture, meta)
    chosen_on_data = circuits is None and data_spec is not None and method == "weight"
    _report(aligned, out, reference, b, chosen_on_data=chosen_on_data)


def _report(
    aligned: AlignedPair, out: str, reference: str | None, b: LoadedModel, *, chosen_on_data: bool
) -> None:
    """What the run did, in a few lines: the form, the objective, masks, the start, the
    files written (``chosen_on_data``: the form was chosen on training data)."""
    result = aligned.result
    assert aligned.choice is not None  # align_models always says which form it took
    if "form_midpoint_losses" in aligned.metadata:  # the form was chosen on --data
        losses = ", ".join(
            f"{k} {v:.4g}" for k, v in aligned.metadata["form_midpoint_losses"].items()
        )
        click.echo(f"form: {aligned.choice.name} (lower midpoint training loss: {losses})")
    elif chosen_on_data:
        click.echo(aligned.choice.describe())
    click.echo(result.summary())
    for line in aligned.left_out:  # checked on B: the spec was inferred on A
        click.echo(f"left out: {line}")
    if "masked_rows" in aligned.metadata:
        rows = max(aligned.metadata["masked_rows"].values())
        click.echo(f"masked {rows} token rows that never occur in the training split")
    if "start" in aligned.metadata:  # the start was chosen on --data
        click.echo(f"start: {aligned.metadata['start']['chosen']} (lower midpoint training loss)")
    if result.stop and result.iteration_unit == "sweeps":
        click.echo(f"warning: weight matching stopped early: {result.stop}; raise --max-sweeps",
                   err=True)  # fmt: skip
    click.echo(f"wrote {out}")
    if not aligned.same_architecture and b.format == "hf":
        click.echo(
            f"note: {aligned.form} cannot be written as the folder's own class; wrote an "
            "lmckit checkpoint instead"
        )
    if reference is not None:
        click.echo(f"wrote {reference} (MODEL_A in {aligned.form}: measure barriers against it)")


#: Options only one method reads (the others are refused when given with another method).
METHOD_OPTIONS = {
    "weight": ("start", "max_sweeps"),
    "learned": ("steps", "lr", "batch_size", "max_seconds"),
}


def _refuse_unused_options(method: str) -> None:
    """One line for an option given on the command line that ``method`` does not read."""
    ctx = click.get_current_context()
    for owner, names in METHOD_OPTIONS.items():
        if owner == method:
            continue
        for name in names:
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
                flag = "--" + name.replace("_", "-")
                raise click.ClickException(
                    f"{flag} is an option of --method {owner}; --method {method} does not use it"
                )


def output_kind(path: str) -> OutputKind:
    """The output kind of a model like the one at ``path`` in its own format."""
    return "hf" if model_format(path) == "hf" else "checkpoint"


def _write(
    path: str,
    like: LoadedModel,
    module: nn.Module,
    params: Mapping[str, Tensor],
    same_architecture: bool,
    metadata: dict,
    force: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> None:
    """``params`` in ``like``'s format, or as an lmckit checkpoint of a rewritten form."""
    if same_architecture:
        save_model(path, like, params, metadata=metadata, overwrite=force, dtype=dtype)
    else:
        assert isinstance(module, ZooModel)  # a rewrite's new form is a zoo configuration
        save(path, module, dict(params), metadata=metadata, overwrite=force)
