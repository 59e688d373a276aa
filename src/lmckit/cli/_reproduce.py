"""``lmckit reproduce``: one paper result by name (table, figures, results.json)."""

from __future__ import annotations

from pathlib import Path

import click

from lmckit.cli._common import (
    check_out_dir,
    choice_option,
    fail,
    force_option,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
)

__all__ = ["command"]


@click.command("reproduce")
@click.argument("name", required=False)
@click.option("--quick", is_flag=True, help="CPU-minute version (small models, few steps).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Output folder (default: runs/NAME).",
)
@click.option(
    "--data-root",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder with mnist/, tinyshakespeare/, gpt2_tokenizer/ "
    "(default: $LMCKIT_DATA_ROOT or ../shared/data).",
)
@seed_option()
@choice_option(
    "--device",
    ["auto", "cpu", "cuda"],
    "auto",
    "Where training and path evaluation run (auto: CUDA when available).",
)
@click.option("--list", "list_only", is_flag=True, help="List the experiments and exit.")
@force_option
@threads_option
@quiet_option
def command(
    name: str | None,
    quick: bool,
    out_dir: str | None,
    data_root: str | None,
    seed: int,
    device: str,
    list_only: bool,
    force: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Run a paper result by NAME: print its table, write figures and results.json."""
    from lmckit.experiments import ExperimentContext, list_experiments, run_experiment
    from lmckit.experiments._registry import default_data_root

    if list_only or name is None:
        for exp, doc in list_experiments().items():
            click.echo(f"{exp:<20} {doc}")
        return
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise fail("--device cuda: no CUDA device is available")
    # resolved once (``~`` too): the experiments read it, and the output guard keeps --out off it
    root = (Path(data_root) if data_root else default_data_root()).expanduser()
    target = Path(out_dir or Path("runs") / name)
    check_out_dir(str(target), "experiment", [str(root)], force)
    set_threads(threads)
    ctx = ExperimentContext(
        out_dir=target,
        data_root=root,
        quick=quick,
        seed=seed,
        progress=not quiet,
        log=click.echo,
        device=device,
    )
    result = run_experiment(name, ctx)
    click.echo(result.table)
    if result.notes:
        click.echo(result.notes)
    for fig in result.figures:
        click.echo(f"wrote {fig}")
    click.echo(f"wrote {ctx.out_dir / 'results.json'}")
