"""``lmckit symmetries``: the spaces lmckit would align a model under, before aligning."""

from __future__ import annotations

import click

from lmckit.cli._common import (
    check_out_files,
    choice_option,
    force_option,
    input_paths,
    write_json_output,
)
from lmckit.formats._io import load_model
from lmckit.forms._recipe import SYMMETRIES

__all__ = ["command"]


@click.command("symmetries")
@click.argument("model", type=click.Path(exists=True))
@choice_option(
    "--symmetry",
    SYMMETRIES,
    None,
    "As for `lmckit align`: permutation (orthogonal spaces become permutations) or "
    "orthogonal (a residual stream rotated, after the rewrite that allows it). Default: "
    "the architecture's own groups.",
)
@click.option(
    "--circuits", is_flag=True, help="lmckit's transformers: heads as QK/OV circuits first."
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write the report as JSON here; '-' writes it to stdout (for jq), and the text "
    "report to stderr.",
)
@force_option
def command(
    model: str, symmetry: str | None, circuits: bool, json_path: str | None, force: bool
) -> None:
    """List MODEL's symmetry spaces: what `lmckit align` would align, and what it cannot move.

    MODEL is an lmckit checkpoint or a Hugging Face folder. Prints each space (group,
    units, parameters it moves), the share of parameters no space moves, and what the
    graph analysis left out and why.
    """
    from lmckit.workflow._symmetries import describe_symmetries

    check_out_files(input_paths(model), json=json_path, force=force)
    report = describe_symmetries(load_model(model), symmetry=symmetry, circuits=circuits)
    click.echo(report.text())
    if json_path:
        write_json_output(json_path, report.to_dict())
