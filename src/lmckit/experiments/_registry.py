"""Registry of reproducible experiments: ``@register_experiment`` and ``run_experiment``.

An experiment is a function ``fn(ctx: ExperimentContext) -> ExperimentResult``. It
prints nothing itself: it returns a table (text), machine-readable rows, and the
figures it wrote under ``ctx.out_dir``. ``lmckit reproduce NAME`` runs it and writes
``table.txt`` and ``results.json`` beside the figures.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmckit._registry import Registry, summary
from lmckit.outputs._atomic import write_json, write_text
from lmckit.outputs._folders import RUN_MARKER, check_no_links

__all__ = [
    "ExperimentContext",
    "ExperimentResult",
    "default_data_root",
    "get_experiment",
    "list_experiments",
    "register_experiment",
    "run_experiment",
]


@dataclass(frozen=True)
class ExperimentContext:
    """How to run an experiment (not what it computes).

    Attributes:
        out_dir: where figures go (created by ``run_experiment``).
        data_root: folder holding ``mnist/``, ``tinyshakespeare/``, ``gpt2_tokenizer/``.
        quick: a CPU-minute version (used by the tests).
        seed: base seed.
        progress: show progress bars.
        log: progress messages for the user.
        device: where training and path evaluation run: ``auto`` (CUDA when
            available), ``cpu`` or ``cuda`` (see :mod:`lmckit.experiments._runner`).
    """

    out_dir: Path
    data_root: Path
    quick: bool = False
    seed: int = 0
    progress: bool = True
    log: Callable[[str], None] = field(default=lambda _msg: None)
    device: str = "auto"

    def data(self, name: str) -> Path:
        """Path of a dataset folder under ``data_root``, with a clear error if absent."""
        path = self.data_root / name
        if not path.exists():
            raise FileNotFoundError(
                f"{path} not found: pass --data-root (or set LMCKIT_DATA_ROOT) to the "
                f"folder that holds {name}/"
            )
        return path


@dataclass(frozen=True)
class ExperimentResult:
    """A table for people, rows for machines, and the figures written."""

    table: str
    rows: list[dict[str, Any]]
    figures: list[Path] = field(default_factory=list)
    notes: str = ""


Experiment = Callable[[ExperimentContext], ExperimentResult]


def register_experiment(name: str, *, paper: str = "") -> Callable[[Experiment], Experiment]:
    """Decorator adding an experiment under ``name`` (``paper``: where the claim is from)."""

    def deco(fn: Experiment) -> Experiment:
        _EXPERIMENTS.add(name, (fn, paper))
        return fn

    return deco


def _load_all() -> None:
    # importing the package registers every experiment module it lists
    import lmckit.experiments  # noqa: F401


_EXPERIMENTS: Registry[tuple[Experiment, str]] = Registry("experiment", load=_load_all)


def list_experiments() -> dict[str, str]:
    """Experiment names mapped to the first line of their docstrings."""
    return {name: summary(_EXPERIMENTS.get(name)[0]) for name in _EXPERIMENTS.names()}


def get_experiment(name: str) -> Experiment:
    """The experiment registered as ``name`` (``KeyError`` listing the valid names)."""
    return _EXPERIMENTS.get(name)[0]


def default_data_root() -> Path:
    """``$LMCKIT_DATA_ROOT``, else ``../shared/data`` relative to the working directory."""
    return Path(os.environ.get("LMCKIT_DATA_ROOT", "../shared/data"))


def run_experiment(name: str, ctx: ExperimentContext) -> ExperimentResult:
    """Run ``name``; write ``table.txt`` and ``results.json`` into ``ctx.out_dir``."""
    fn = get_experiment(name)
    check_no_links(ctx.out_dir)  # filled in place: never written through a link
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    # marks the folder as an lmckit experiment's before anything else is written into it
    write_json(ctx.out_dir / RUN_MARKER, {"experiment": name})
    result = fn(ctx)
    write_text(ctx.out_dir / "table.txt", result.table + "\n")
    write_json(
        ctx.out_dir / "results.json",
        {
            "experiment": name,
            "quick": ctx.quick,
            "seed": ctx.seed,
            "rows": result.rows,
            "figures": [str(p) for p in result.figures],
            "notes": result.notes,
        },
    )
    return result
