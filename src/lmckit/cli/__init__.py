"""The ``lmckit`` command line: parse, validate, call one library function, write.

One module per command (:mod:`lmckit.cli._demo`, ``train``, ``align``, ``barrier``,
``merge``, ``curve``, ``landscape``, ``ensemble``, ``soup``, ``reproduce``), each
exposing ``command``; :mod:`lmckit.cli._common` holds the shared options, the one
function that loads models, data loading and the output checks. Command modules are
imported only when their command runs (or ``--help`` lists them), so start-up stays
light and an interrupt during it is handled like any other.

One error path (:class:`LmckitGroup`): a user mistake (any error the library documents:
``ValueError`` and its subclasses, missing files, ...) prints one line ``Error: ...``
and exits 1; a usage error (an unknown option, a value out of range) is click's, exit
2; Ctrl-C prints ``interrupted`` and exits 130; anything else is a bug: its traceback,
then a line asking to report it, exit 1.

Command names, options and output formats are a contract; keep them stable.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import click

from lmckit._errors import ParameterError
from lmckit.cli._flags import flag_spelling
from lmckit.runtime._allocator import keep_large_blocks_mapped

__all__ = ["main"]

#: Command name -> module under ``lmckit.cli`` defining it as ``command``.
COMMANDS = {
    "demo": "_demo",
    "train": "_train",
    "align": "_align",
    "barrier": "_barrier",
    "merge": "_merge",
    "curve": "_curve",
    "landscape": "_landscape",
    "ensemble": "_ensemble",
    "soup": "_soup",
    "symmetries": "_symmetries",
    "reproduce": "_reproduce",
}
#: Commands that split their work between the processes ``torchrun`` starts
#: (:func:`lmckit.cli._common.join_processes`); the others refuse to run under it.
SPLIT_COMMANDS = ("align", "barrier", "curve", "landscape", "ensemble")
EXIT_INTERRUPTED = 130
BUG_REPORT = (
    "lmckit: this is a bug in lmckit, not a mistake in what you asked; please report it "
    "with the command you ran and the traceback above."
)
# Errors the library documents for bad input: reported as one line, never a traceback.
_USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    KeyError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    NotImplementedError,
    FloatingPointError,
)


def _message(err: BaseException) -> str:
    if isinstance(err, KeyError) and err.args:
        return str(err.args[0])
    return str(err) or type(err).__name__


def _out_of_memory(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, MemoryError) or (
        isinstance(err, RuntimeError)
        and ("out of memory" in text or "can't allocate memory" in text)
    )


# an interrupt swallowed on its way up (raised inside a ``__del__`` or a callback whose
# exceptions Python only prints) is raised again this often, then the process exits
INTERRUPT_RETRY_S = 5.0
INTERRUPT_RETRIES = 3


def _interrupt_handler() -> Callable[[int, FrameType | None], None]:
    """A SIGINT handler: ``KeyboardInterrupt`` now, and again on SIGALRM every
    ``INTERRUPT_RETRY_S`` while the process is still there (a swallowed exception must
    not leave a long run going); after ``INTERRUPT_RETRIES`` retries, exit 130."""
    raised = 0

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if signum == signal.SIGALRM and raised > INTERRUPT_RETRIES:
            sys.stderr.write("interrupted\n")
            os._exit(EXIT_INTERRUPTED)
        raised += 1
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, INTERRUPT_RETRY_S)
        raise KeyboardInterrupt

    return handler


@contextlib.contextmanager
def _interrupts_raised_again() -> Iterator[None]:
    """:func:`_interrupt_handler` on SIGINT for the block (in the main thread; the
    caller's handler and no pending retry afterwards: tests invoke the CLI in-process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, _interrupt_handler())
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGINT, before)


def _interrupted(err: BaseException) -> bool:
    return isinstance(err, KeyboardInterrupt) or isinstance(err.__cause__, KeyboardInterrupt)


class LmckitGroup(click.Group):
    """Commands loaded on demand, and the one error path described in the module."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        return importlib.import_module(f"lmckit.cli.{module}").command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except ParameterError as err:  # the library's words, in this command's flags
            name = ctx.invoked_subcommand
            command = self.get_command(ctx, name) if name else None
            raise click.ClickException(err.render(flag_spelling(command))) from None
        except _USER_ERRORS as err:
            raise click.ClickException(_message(err)) from None
        except OSError as err:
            if err.errno == errno.EPIPE:
                raise  # stdout closed (``lmckit ... | head``): click exits quietly
            # reads are reported by the library as ValueError; what is left is writing
            raise click.ClickException(f"could not write output: {err}") from None
        except (MemoryError, RuntimeError) as err:
            if not _out_of_memory(err):
                raise
            raise click.ClickException(f"out of memory: {_message(err)}") from None

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        with _interrupts_raised_again():
            self._run(args, prog_name, complete_var, **extra)

    def _run(
        self, args: Any, prog_name: str | None, complete_var: str | None, **extra: Any
    ) -> None:
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as err:
            err.show()
            sys.exit(err.exit_code)
        except (click.Abort, KeyboardInterrupt) as err:
            if _interrupted(err):
                click.echo("interrupted", err=True)
                sys.exit(EXIT_INTERRUPTED)
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except Exception:
            traceback.print_exc()
            click.echo(BUG_REPORT, err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=LmckitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lmckit")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Align, merge and measure linear mode connectivity between neural networks."""
    # large tensors freed between spaces go back to the system (lmckit.runtime._allocator)
    keep_large_blocks_mapped()
    if ctx.invoked_subcommand not in SPLIT_COMMANDS:
        from lmckit.cli._common import fail, launched_processes

        if launched_processes() > 1:
            raise fail(
                f"lmckit {ctx.invoked_subcommand} runs in one process; under torchrun only "
                f"{', '.join(SPLIT_COMMANDS[:-1])} and {SPLIT_COMMANDS[-1]} split their work "
                "between processes"
            )
