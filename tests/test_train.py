"""Training: deterministic per seed, actually learns, pure, and leaves the global RNG alone."""

from __future__ import annotations

import pytest
import torch

from lmckit.data import batches
from lmckit.measure._evaluate import evaluate
from lmckit.models import create_model
from lmckit.symmetry._params import Params
from lmckit.training._train import TrainConfig, fit

SMALL = TrainConfig(epochs=2, batch_size=64, lr=3e-3)


def _mlp(seed: int = 0, **kwargs):
    return create_model("mlp", seed=seed, in_features=64, hidden=[32], out_features=10, **kwargs)


def _equal(a: Params, b: Params) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_gives_identical_params(digits) -> None:
    model, init = _mlp(norm="batch")
    first = fit(model, init, digits, SMALL, seed=3, progress=False).params
    second = fit(model, init, digits, SMALL, seed=3, progress=False).params
    assert _equal(first, second)
    other = fit(model, init, digits, SMALL, seed=4, progress=False).params
    assert not _equal(first, other)
    # batch statistics are trained too
    assert not torch.equal(first["norms.0.running_mean"], init["norms.0.running_mean"])


def test_loss_decreases_on_digits(digits) -> None:
    model, init = _mlp()
    config = TrainConfig(epochs=3, batch_size=64, lr=1e-2)
    trained = fit(model, init, digits, config, progress=False).params
    test = lambda: batches(digits.x_test, digits.y_test, 500)  # noqa: E731
    before, after = evaluate(model, init, test()), evaluate(model, trained, test())
    assert after.loss < 0.5 * before.loss
    assert after.acc > 0.85


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_other_optimizers_learn(digits, optimizer: str) -> None:
    model, init = _mlp()
    config = TrainConfig(
        epochs=2,
        batch_size=64,
        optimizer=optimizer,
        lr=0.05 if optimizer == "sgd" else 3e-3,
        warmup=0.1,
    )
    trained = fit(model, init, digits, config, progress=False).params
    test = lambda: batches(digits.x_test, digits.y_test, 500)  # noqa: E731
    assert evaluate(model, trained, test()).loss < evaluate(model, init, test()).loss


def test_inputs_and_global_rng_are_untouched(digits) -> None:
    model, init = _mlp(norm="batch")
    init_copy = {k: v.clone() for k, v in init.items()}
    module_copy = {k: v.clone() for k, v in model.state_dict().items()}
    x_copy = digits.x_train.clone()
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    fit(model, init, digits, SMALL, seed=0, progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    assert _equal(init, init_copy)
    assert _equal(model.state_dict(), module_copy)
    assert torch.equal(digits.x_train, x_copy)


def test_training_does_not_depend_on_the_global_rng(digits) -> None:
    model, init = _mlp()
    torch.manual_seed(1)
    first = fit(model, init, digits, SMALL, seed=0, progress=False).params
    torch.manual_seed(2)
    second = fit(model, init, digits, SMALL, seed=0, progress=False).params
    assert _equal(first, second)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"optimizer": "rmsprop"},
        {"schedule": "linear"},
        {"epochs": 0},
        {"batch_size": 0},
        {"lr": 0.0},
        {"weight_decay": -1.0},
        {"warmup": 1.0},
        {"warmup": -0.1},
    ],
)
def test_config_validation(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        TrainConfig(**kwargs)


def test_nan_initial_params_are_refused(digits) -> None:
    model, init = _mlp()
    bad = dict(init)
    bad["head.bias"] = torch.full_like(init["head.bias"], float("nan"))
    with pytest.raises(ValueError, match="'head.bias' contains NaN"):
        fit(model, bad, digits, SMALL, progress=False)


def test_divergence_is_reported(digits) -> None:
    model, init = _mlp()
    config = TrainConfig(epochs=1, batch_size=64, optimizer="sgd", lr=1e12, schedule="constant")
    with pytest.raises(FloatingPointError, match="diverged"):
        fit(model, init, digits, config, progress=False)
