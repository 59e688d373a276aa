"""Train one model: build it from a seed, fit it, measure it on the test split."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmckit.data import Dataset
from lmckit.data._fit import check_data_fits
from lmckit.measure._evaluate import Metrics
from lmckit.measure._measure import evaluate_split
from lmckit.models import ModelConfig, ZooModel, create_model
from lmckit.models._memory import check_training_fits
from lmckit.training._train import TrainConfig, TrainResult, fit

__all__ = ["TrainedModel", "train_model"]


@dataclass(frozen=True)
class TrainedModel:
    """What :func:`train_model` returns: the module, its training record, test metrics."""

    module: ZooModel
    result: TrainResult
    test: Metrics


def train_model(
    config: ModelConfig,
    data: Dataset,
    train: TrainConfig,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    eval_batch_size: int | None = None,
    progress: bool = False,
) -> TrainedModel:
    """Build ``config`` from ``seed``, train it on ``data``, measure it on the test split.

    The memory the run needs (:func:`lmckit.models._memory.training_memory`: weights,
    training copy, gradients, two optimiser moments, the step's temporaries and one
    batch's activations, counted on the meta device) is checked against the machine's
    before anything is built, and the data against the model before any step.

    Raises:
        ValueError: a model that does not fit memory or the data, or a bad setting.
    """
    check_training_fits(
        config,
        input_shape=data.input_shape,
        tokens=data.is_language,
        batch_size=min(train.batch_size, max(1, len(data.x_train))),
    )
    module = create_model(config.name, seed=seed, **config.kwargs)[0]
    # the initial parameters are the module's own tensors (training works on a copy and
    # changes neither): a second copy beside them would only raise the peak memory
    params = {k: v.detach() for k, v in module.state_dict().items()}
    check_data_fits(module, data)
    result = fit(module, params, data, train, seed=seed, device=device, progress=progress)
    test = evaluate_split(module, result.params, data, batch_size=eval_batch_size)
    return TrainedModel(module, result, test)
