"""``lmckit align``: B aligned to A under the architecture's symmetries, in B's format."""

from __future__ import annotations

from pathlib import Path

import click
from torch import nn

from lmckit.checkpoint import save
from lmckit.cli.common import (
    check_out_dir,
    choice_option,
    count_option,
    data_option,
    force_option,
    input_paths,
    load_dataset,
    load_models,
    model_pair_arguments,
    parse_device,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
    validate_data_spec,
)
from lmckit.io import LoadedModel, save_model
from lmckit.models import ZooModel
from lmckit.outputs import REFERENCE_DIR
from lmckit.recipe import SYMMETRIES
from lmckit.workflow import ALIGN_METHODS, align_models, align_output_kind

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
    ["anchored", "identity", "best"],
    "anchored",
    "Weight matching: anchored solves each space outward from what the models share "
    "(inputs, tokens, classes) first; identity starts from the identity (lmckit 0.1); "
    "best runs both and keeps the one whose midpoint has the lower loss on --data's "
    "training split (up to 32,768 labels or tokens).",
)
@count_option("--steps", 500, "Learned matching: max steps.")
@click.option(
    "--lr", type=float, default=0.01, show_default=True, help="Learned matching: AdamW rate."
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
    "value/output bases by orthogonal maps (data-free; the function is unchanged).",
)
@click.option(
    "--circuits",
    is_flag=True,
    help="Transformers: rewrite both models' heads as QK/OV circuits first (exact) and "
    "align in that form, the form in which heads have no inner bases; writes both.",
)
@data_option
@click.option(
    "--out", type=click.Path(file_okay=False), required=True, help="Directory for B aligned to A."
)
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
    steps: int,
    lr: float,
    device: str,
    head_bases: bool,
    circuits: bool,
    data_spec: str | None,
    out: str,
    seed: int,
    force: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Align MODEL_B to MODEL_A under the architecture's symmetries; write the result."""
    from lmckit.aligners import LearnedMatchingConfig, WeightMatchingConfig

    kind = align_output_kind(model_b, symmetry)
    check_out_dir(out, kind, input_paths(model_a, model_b, data_spec=data_spec), force)
    set_threads(threads)
    if circuits and head_bases:
        raise click.ClickException("--head-bases aligns bases inside heads; --circuits leaves none")
    config: LearnedMatchingConfig | WeightMatchingConfig | None = None
    if method == "learned":
        config = LearnedMatchingConfig(steps=steps, lr=lr)
    elif method == "weight":
        config = WeightMatchingConfig(start=start)
    torch_device = parse_device(device)
    reads_data = method != "weight" or start == "best"
    if not reads_data:
        validate_data_spec(data_spec)  # weight matching reads no data, but a bad spec is an error
    elif data_spec is None and method == "weight":
        raise click.ClickException("--start best compares the starts on training data: give --data")
    a, b = load_models([model_a, model_b])
    data = load_dataset(data_spec) if reads_data else None
    aligned = align_models(
        a,
        b,
        method=method,
        symmetry=symmetry,
        circuits=circuits,
        head_bases=head_bases,
        data=data,
        seed=seed,
        config=config,
        device=torch_device,
        progress=not quiet,
    )
    metadata = {"aligned_to": str(model_a), "source": str(model_b), **aligned.metadata}
    metadata["data"] = data_spec
    reference = str(Path(out) / REFERENCE_DIR) if aligned.reference is not None else None
    if reference is not None:
        # B is written in the form it was aligned in: A's same form is the reference
        metadata["reference"] = reference
    _write(out, b, aligned.module, aligned.params, aligned.same_architecture, metadata, force)
    if reference is not None and aligned.reference is not None:
        meta = {"rewritten_from": str(model_a), "form": aligned.form}
        # inside the folder just written, so new: nothing to force
        _write(reference, a, aligned.module, aligned.reference, aligned.same_architecture, meta)
    click.echo(aligned.result.summary())
    click.echo(f"wrote {out}")
    if not aligned.same_architecture and b.format == "hf":
        click.echo(
            f"note: {aligned.form} cannot be written as the folder's own class; wrote an "
            "lmckit checkpoint instead"
        )
    if reference is not None:
        click.echo(f"wrote {reference} (MODEL_A in {aligned.form}: measure barriers against it)")


def _write(
    path: str,
    like: LoadedModel,
    module: nn.Module,
    params: dict,
    same_architecture: bool,
    metadata: dict,
    force: bool = False,
) -> None:
    """``params`` in ``like``'s format, or as an lmckit checkpoint of a rewritten form."""
    if same_architecture:
        save_model(path, like, params, metadata=metadata, overwrite=force)
    else:
        assert isinstance(module, ZooModel)  # a rewrite's new form is a zoo configuration
        save(path, module, params, metadata=metadata, overwrite=force)
