"""``lmckit align``: B aligned to A under the architecture's symmetries, as a checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from lmckit.checkpoint import save
from lmckit.cli.common import (
    POSITIVE,
    check_out_dir,
    data_option,
    force_option,
    input_paths,
    load_dataset,
    load_models,
    parse_device,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
    validate_data_spec,
)
from lmckit.recipe import SYMMETRIES
from lmckit.workflow import ALIGN_METHODS, align_checkpoints

__all__ = ["command"]


@click.command("align")
@click.argument("model_a", type=click.Path(exists=True))
@click.argument("model_b", type=click.Path(exists=True))
@click.option(
    "--method",
    type=click.Choice(list(ALIGN_METHODS)),
    default="weight",
    show_default=True,
    help="learned: straight-through learned matching from weight matching (needs --data).",
)
@click.option(
    "--symmetry",
    type=click.Choice(SYMMETRIES),
    default=None,
    help="permutation: orthogonal spaces become permutations; orthogonal: residual stream "
    "by an orthogonal map (LayerNorm transformers are rewritten to RMSNorm first). "
    "Default: the architecture's own groups.",
)
@click.option(
    "--steps", type=POSITIVE, default=500, show_default=True, help="Learned matching: max steps."
)
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
    from lmckit.align import LearnedMatchingConfig

    check_out_dir(out, "checkpoint", input_paths(model_a, model_b, data_spec=data_spec), force)
    set_threads(threads)
    if circuits and head_bases:
        raise click.ClickException("--head-bases aligns bases inside heads; --circuits leaves none")
    learned = LearnedMatchingConfig(steps=steps, lr=lr) if method == "learned" else None
    torch_device = parse_device(device)
    if method == "weight":
        validate_data_spec(data_spec)  # weight matching reads no data, but a bad spec is an error
    a, b = load_models([model_a, model_b])
    data = load_dataset(data_spec) if method != "weight" else None
    aligned = align_checkpoints(
        a,
        b,
        method=method,
        symmetry=symmetry,
        circuits=circuits,
        head_bases=head_bases,
        data=data,
        seed=seed,
        config=learned,
        device=torch_device,
        progress=not quiet,
    )
    metadata = {"aligned_to": str(model_a), "source": str(model_b), **aligned.metadata}
    metadata["data"] = data_spec
    reference = None
    if aligned.reference is not None:
        # B is saved rewritten (RMSNorm form, circuits): A's same form is the reference
        reference = str(Path(out) / "reference")
        metadata["reference"] = reference
    save(out, aligned.config, aligned.params, metadata=metadata)
    if aligned.reference is not None:
        save(reference, aligned.reference.config, aligned.reference.params,
             metadata={"rewritten_from": str(model_a)})  # fmt: skip
    click.echo(aligned.result.summary())
    click.echo(f"wrote {out}")
    if reference is not None:
        click.echo(f"wrote {reference} (MODEL_A in {aligned.form}: measure barriers against it)")
