"""``lmckit symmetries``: the spaces lmckit would align a model under, before aligning."""

from __future__ import annotations

import click

from lmckit.atomic import write_json
from lmckit.cli.common import check_out_files, choice_option, input_paths
from lmckit.io import load_model
from lmckit.recipe import SYMMETRIES

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
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the report.")
def command(model: str, symmetry: str | None, circuits: bool, json_path: str | None) -> None:
    """List MODEL's symmetry spaces: what `lmckit align` would align, and what it cannot move.

    MODEL is an lmckit checkpoint or a Hugging Face folder. Prints each space (group,
    units, parameters it moves), the share of parameters no space moves, and what the
    graph analysis left out and why.
    """
    from lmckit.workflow.symmetries import describe_symmetries

    check_out_files(input_paths(model), json=json_path)
    report = describe_symmetries(load_model(model), symmetry=symmetry, circuits=circuits)
    click.echo(report.text())
    if json_path:
        write_json(json_path, report.to_dict())
        click.echo(f"wrote {json_path}")
