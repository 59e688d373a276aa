"""``lmckit demo``: two MLPs on digits, barriers by alignment method, a plot."""

from __future__ import annotations

import click

from lmckit.cli._common import (
    check_out_files,
    force_option,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
    write_json_output,
)

__all__ = ["command"]


@click.command("demo")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write the three path results as JSON here; '-' writes them to stdout (for jq), "
    "and the table and logs to stderr.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default="lmckit-demo.png",
    show_default=True,
    help="Write the plot here.",
)
@seed_option("Seed of model A (model B uses seed + 1).")
@force_option
@threads_option
@quiet_option
def command(
    json_path: str | None,
    plot_path: str,
    seed: int,
    force: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Train two MLPs on scikit-learn digits and compare barriers by alignment method."""
    from lmckit.experiments._demo import run_demo
    from lmckit.measure._measure import path_table
    from lmckit.measure._plot import plot_paths

    check_out_files([], json=json_path, plot=plot_path, force=force)
    set_threads(threads)
    results = run_demo(seed=seed, progress=not quiet, log=click.echo)
    click.echo(path_table(results))
    if json_path:
        write_json_output(json_path, {k: v.to_dict() for k, v in results.items()})
    plot_paths(results, plot_path, title="Two MLPs on digits: linear paths", overwrite=force)
    click.echo(f"wrote {plot_path}")
