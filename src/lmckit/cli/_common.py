"""What every command shares: options, loading models and data, checking outputs.

Models are loaded by one function, :func:`lmckit.formats.load_model`, so that every command
accepts the same sources: lmckit checkpoints (or state dicts with a ``config.json``) and
Hugging Face folders.
Errors are raised as the library's exceptions (or :func:`fail`); the group in
:mod:`lmckit.cli` turns them into one ``Error:`` line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
import torch

from lmckit.data import Dataset, load_data
from lmckit.data._source import DATA_SPEC_HELP, check_data_spec, data_spec_paths
from lmckit.formats._io import LoadedModel, load
from lmckit.outputs import OutputKind, check_output_dir, check_output_file
from lmckit.outputs._atomic import write_json
from lmckit.outputs._places import check_distinct_outputs

__all__ = [
    "SEED",
    "STDOUT",
    "check_out_dir",
    "check_out_files",
    "count_option",
    "data_option",
    "fail",
    "force_option",
    "input_paths",
    "join_processes",
    "launched_processes",
    "load_dataset",
    "DTYPES",
    "dtype_option",
    "load_models",
    "output_dtype",
    "model_pair_arguments",
    "parse_device",
    "quiet_option",
    "seed_option",
    "set_threads",
    "threads_option",
    "validate_data_spec",
    "write_json_output",
]

FC = TypeVar("FC", bound=Callable[..., object])
#: Seeds PyTorch, NumPy and scikit-learn all accept.
SEED = click.IntRange(0, 2**32 - 1)
POSITIVE = click.IntRange(min=1)


def fail(message: str) -> click.ClickException:
    """A user mistake found by the command line itself: ``raise fail("...")``."""
    return click.ClickException(message)


data_option = click.option("--data", "data_spec", metavar="SPEC", help=DATA_SPEC_HELP)
threads_option = click.option(
    "--threads",
    type=POSITIVE,
    default=None,
    help="CPU threads for PyTorch (default: PyTorch's choice).",
)


def _no_bars_off_a_terminal(
    _ctx: click.Context, _param: click.Parameter, quiet: bool | None
) -> bool:
    # by default progress bars (tqdm, on stderr) only where someone watches: a log file or
    # a pipe would fill with carriage-return frames
    return not sys.stderr.isatty() if quiet is None else quiet


quiet_option = click.option(
    "--quiet/--progress",
    default=None,
    callback=_no_bars_off_a_terminal,
    help="No progress bars / progress bars even when stderr is not a terminal. "
    "Default: bars on a terminal only.",
)
force_option = click.option(
    "--force",
    is_flag=True,
    help="Replace an existing output lmckit did not write: a non-empty --out folder, a "
    "--json or --plot file (never an input, a device, a file inside a model folder, the "
    "working directory, the home folder or their parents).",
)


def model_pair_arguments(fn: FC) -> FC:
    """The positional ``MODEL_A`` (the reference) and ``MODEL_B`` (the one moved) of a
    command on a pair: lmckit checkpoints or Hugging Face folders."""
    fn = click.argument("model_b", type=click.Path(exists=True))(fn)
    return click.argument("model_a", type=click.Path(exists=True))(fn)


def count_option(name: str, default: int | None, help: str | None = None) -> Callable[[FC], FC]:
    """An option taking a whole number >= 1; its default is shown unless it is ``None``."""
    return click.option(
        name, type=POSITIVE, default=default, show_default=default is not None, help=help
    )


def choice_option(
    name: str, choices: Sequence[str], default: str | None, help: str | None = None
) -> Callable[[FC], FC]:
    """An option taking one of ``choices``; its default is shown unless it is ``None``."""
    return click.option(
        name,
        type=click.Choice(list(choices)),
        default=default,
        show_default=default is not None,
        help=help,
    )


#: ``--dtype`` values: the stored floating dtype of a Hugging Face output.
DTYPES = {
    "auto": None,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

dtype_option = choice_option(
    "--dtype",
    list(DTYPES),
    "auto",
    "Hugging Face output: the floating dtype its weights are stored in; auto: the input "
    "folder's (computation runs in float32 either way, values are rounded once on writing).",
)


def output_dtype(name: str, kind: str) -> torch.dtype | None:
    """The dtype ``--dtype`` names (``None``: the input's), refused for an output that is
    not a Hugging Face folder."""
    if name != "auto" and kind != "hf":
        raise fail(f"--dtype {name} is for Hugging Face outputs; this one is an lmckit checkpoint")
    return DTYPES[name]


def seed_option(help: str | None = None) -> Callable[[FC], FC]:
    """``--seed``, default 0, limited to the seeds every random source accepts."""
    return click.option("--seed", type=SEED, default=0, show_default=True, help=help)


# --------------------------------------------------------------------------- models


def load_models(
    paths: Sequence[str],
    *,
    forms: bool = False,
    dtype: torch.dtype | None = torch.float32,
    check_values: bool = True,
) -> list[LoadedModel]:
    """Load models that must share one architecture; mismatches name both paths.

    ``forms``: when a model records the form ``lmckit align`` wrote it in, the others
    may be in their own form (the path is measured after putting them in that form,
    :func:`lmckit.workflow.path_form`, which checks the architectures then).
    ``dtype``, ``check_values``: as :func:`lmckit.formats.load` (``None``: as stored).
    """
    if forms:
        from lmckit.workflow._pair import recorded_form

        if any(recorded_form(p) is not None for p in paths):
            return [load(p, dtype=dtype, check_values=check_values) for p in paths]
    first = load(paths[0], dtype=dtype, check_values=check_values)
    return [first, *(load(p, like=first, dtype=dtype, check_values=check_values)
                     for p in paths[1:])]  # fmt: skip


# --------------------------------------------------------------------------- data


def load_dataset(spec: str | None, *, seed: int = 0) -> Dataset:
    """The dataset ``--data`` names; a clear error when it is missing."""
    if spec is None:
        raise fail("this command needs --data")
    return load_data(spec, seed=seed)


def validate_data_spec(spec: str | None) -> None:
    """Check a ``--data`` the command will not read (syntax, files present)."""
    if spec is not None:
        check_data_spec(spec)


def input_paths(*paths: str | None, data_spec: str | None = None) -> list[str]:
    """Every path a command reads: model paths and the files of its data spec."""
    out = [p for p in paths if p]
    if data_spec:
        out += data_spec_paths(data_spec)
    return out


# --------------------------------------------------------------------------- outputs


def check_out_dir(out: str, kind: OutputKind, inputs: list[str], force: bool) -> None:
    """Refuse an output folder that would destroy an input or a user's folder (before work)."""
    check_output_dir(out, kind=kind, inputs=inputs, force=force)


#: ``--json -``: the JSON is written to stdout, and what is printed for people to stderr.
STDOUT = "-"
_JSON_STREAM = "lmckit.json_stdout"


def check_out_files(
    inputs: list[str], *, json: str | None, plot: str | None = None, force: bool = False
) -> None:
    """Refuse ``--json``/``--plot`` targets the output policy refuses (an input, a file
    inside a model folder, a device, a file lmckit did not write without ``force``), a
    plot of an unknown image type, or one path named twice (one would overwrite the
    other). ``--json -`` is stdout (:func:`report_beside_json`); ``--plot -`` is refused."""
    if plot == STDOUT:
        raise fail("--plot -: a figure is written to a file; name one (e.g. --plot path.png)")
    json_file = None if json == STDOUT else json
    check_distinct_outputs({"--json": json_file, "--plot": plot})
    if json_file is not None:
        check_output_file(json_file, inputs=inputs, force=force)
    if plot is not None:
        from lmckit.measure._plot import PLOT_SUFFIXES

        check_output_file(plot, inputs=inputs, suffixes=PLOT_SUFFIXES, force=force)
    if json == STDOUT:
        report_beside_json()


def report_beside_json() -> None:
    """``--json -``: the JSON will be this command's stdout (for ``jq``), so from now on
    what it prints for people (tables, ``wrote ...``, logs) goes to stderr."""
    ctx = click.get_current_context()
    if _JSON_STREAM in ctx.meta:
        return
    real = sys.stdout
    ctx.meta[_JSON_STREAM] = real
    sys.stdout = sys.stderr
    ctx.call_on_close(lambda: setattr(sys, "stdout", real))


def write_json_output(json_path: str, obj: Any) -> None:
    """Write a command's JSON result to ``json_path`` (atomically), or to stdout when it
    is ``-``; a file written is reported on the human output."""
    if json_path != STDOUT:
        write_json(json_path, obj)
        click.echo(f"wrote {json_path}")
        return
    try:
        text = json.dumps(obj, indent=2, allow_nan=False)
    except ValueError as err:
        raise ValueError(f"cannot write the JSON result: {err}") from err
    # the stdout the command started with (None: the current one)
    click.echo(text, file=click.get_current_context().meta.get(_JSON_STREAM))


# --------------------------------------------------------------------------- machine


def launched_processes() -> int:
    """How many processes ``torchrun`` (or another launcher setting ``WORLD_SIZE``)
    started for this command; 1 without one."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        size = int(value)
    except ValueError:
        raise fail(f"WORLD_SIZE must be a whole number of processes, got {value!r}") from None
    if size < 1:
        raise fail(f"WORLD_SIZE must be at least 1, got {size}")
    return size


def join_processes() -> bool:
    """Join the processes ``torchrun`` started (gloo on the CPU): the library then splits
    its work between them (:mod:`lmckit.runtime._distributed`). Returns whether this process
    reports and writes: process 0, or the only one. The others print nothing on stdout
    (errors still go to stderr) and write nothing."""
    if launched_processes() == 1:
        return True
    import torch.distributed as dist

    from lmckit.runtime._distributed import init_from_env, is_distributed, world

    if not is_distributed():
        if not init_from_env():
            raise fail("torchrun started several processes, but this PyTorch has no "
                       "torch.distributed; run the command in one process")  # fmt: skip
        click.get_current_context().call_on_close(dist.destroy_process_group)
    if world()[0] == 0:
        return True
    # the figures every process computes are the same; one copy on the terminal
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (open for the process's life)
    return False


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


def parse_device(name: str) -> torch.device:
    """A torch device from ``--device`` that can run a computation and hand its result
    back (CUDA only where one is available; ``meta`` holds shapes, not numbers):
    :func:`lmckit._arguments.usable_device`, its messages naming ``--device``."""
    from lmckit._arguments import usable_device

    try:
        return usable_device(name, given=f"--device {name}")
    except ValueError as err:
        raise fail(str(err)) from None
