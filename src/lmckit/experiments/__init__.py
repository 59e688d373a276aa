"""Experiments: each reproduced result is a function returning a table and figures.

Modules listed here register themselves with :func:`register_experiment`; every one runs
through :class:`lmckit.experiments._runner.Runner` (config hash, cached models and stages,
device, figures). The experiments use only lmckit's library; nothing in the library
imports them.
"""

from lmckit.experiments import _gpt2_shakespeare as _gpt2_shakespeare  # noqa: F401
from lmckit.experiments import _identifiability as _identifiability  # noqa: F401
from lmckit.experiments import _landscape as _landscape  # noqa: F401
from lmckit.experiments import _llama_shakespeare as _llama_shakespeare  # noqa: F401
from lmckit.experiments import _lmc_mnist as _lmc_mnist  # noqa: F401
from lmckit.experiments import _transformers as _transformers  # noqa: F401
from lmckit.experiments import _width as _width  # noqa: F401
from lmckit.experiments._registry import (
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
