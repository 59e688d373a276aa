"""Experiments: each reproduced result is a function returning a table and figures.

Modules listed here register themselves with :func:`register_experiment`.
"""

from lmckit.experiments.registry import (
    ExperimentContext,
    ExperimentResult,
    get_experiment,
    list_experiments,
    register_experiment,
    run_experiment,
)

__all__ = [
    "ExperimentContext",
    "ExperimentResult",
    "get_experiment",
    "list_experiments",
    "register_experiment",
    "run_experiment",
]
