"""Experiments: each reproduced result is a function returning a table and figures.

Modules listed here register themselves with :func:`register_experiment`; every one runs
through :class:`lmckit.experiments.runner.Runner` (config hash, cached models and stages,
device, figures). The experiments use only lmckit's library; nothing in the library
imports them.
"""

from lmckit.experiments import gpt2_shakespeare as _gpt2_shakespeare  # noqa: F401
from lmckit.experiments import identifiability as _identifiability  # noqa: F401
from lmckit.experiments import landscape as _landscape  # noqa: F401
from lmckit.experiments import llama_shakespeare as _llama_shakespeare  # noqa: F401
from lmckit.experiments import lmc_mnist as _lmc_mnist  # noqa: F401
from lmckit.experiments import transformers as _transformers  # noqa: F401
from lmckit.experiments import width as _width  # noqa: F401
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
