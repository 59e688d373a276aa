"""Seeded training of a model on a dataset, and the task it is scored by (loss, metric)."""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.training._task import Task, classification, mse
    from lmckit.training._train import TrainConfig, TrainResult, fit

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
