"""`fit` / `train`: step limits, gradient clipping, validation and early stopping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from lmckit.data import Dataset
from lmckit.measure._evaluate import evaluate
from lmckit.models import create_model
from lmckit.symmetry._params import Params
from lmckit.training._train import TrainConfig, fit


def _toy(*, val_labels: str = "same") -> Dataset:
    """Two Gaussian blobs; the validation split is a copy of train with labels kept or flipped."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = (x[:, 0] > 0).long()
    x_val = x[:32].clone()
    y_val = y[:32] if val_labels == "same" else 1 - y[:32]
    return Dataset("toy", x, y, x[64:].clone(), y[64:].clone(), 2, x_val=x_val, y_val=y_val.clone())


def _mlp() -> tuple[nn.Module, Params]:
    return create_model("mlp", seed=0, in_features=8, hidden=[16], out_features=2)


def _equal(a: Params, b: Params) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _val_loss(model: nn.Module, params: Params, data: Dataset) -> float:
    return evaluate(model, params, [data.split("val")]).loss


def test_without_validation_train_is_fit() -> None:
    data, (model, init) = _toy(), _mlp()
    config = TrainConfig(epochs=2, batch_size=32)
    result = fit(model, init, data, config, seed=3, progress=False)
    assert result.steps == 2 * 3 and result.epochs == 2
    assert result.history == [] and result.best is None and not result.stopped_early
    assert _equal(result.params, fit(model, init, data, config, seed=3, progress=False).params)


def test_max_steps_truncates_a_constant_schedule_run() -> None:
    data, (model, init) = _toy(), _mlp()
    config = TrainConfig(epochs=3, batch_size=32, schedule="constant")
    limited = fit(
        model, init, data, TrainConfig(**{**vars(config), "max_steps": 4}), seed=1, progress=False
    )
    assert limited.steps == 4 and limited.epochs == 2
    # Same data order, same constant learning rate: the first 4 steps of a longer run.
    five = fit(
        model, init, data, TrainConfig(**{**vars(config), "max_steps": 5}), seed=1, progress=False
    )
    assert not _equal(limited.params, five.params)
    again = fit(
        model, init, data, TrainConfig(**{**vars(config), "max_steps": 4}), seed=1, progress=False
    )
    assert _equal(limited.params, again.params)


def test_grad_clip_bounds_first_step() -> None:
    # First Nesterov SGD step without weight decay moves the parameters by lr * (1 + m) * g;
    # with clipping, ||g|| = clip, so the step has norm lr * (1 + m) * clip exactly.
    data, (model, init) = _toy(), _mlp()
    clip, lr, m = 1e-3, 0.1, 0.9
    config = TrainConfig(
        epochs=1, batch_size=32, optimizer="sgd", lr=lr, momentum=m, max_steps=1, grad_clip=clip
    )
    new = fit(model, init, data, config, progress=False).params
    moved = math.sqrt(sum(float((new[k] - init[k]).pow(2).sum()) for k in init))
    assert moved == pytest.approx(lr * (1 + m) * clip, rel=1e-4)


def test_early_stopping_returns_best_and_stops() -> None:
    # Validation labels are the training labels flipped: fitting train makes val worse,
    # so the best measurement comes early and patience runs out.
    data, (model, init) = _toy(val_labels="flipped"), _mlp()
    base = dict(epochs=20, batch_size=16, schedule="constant", lr=1e-2)
    config = TrainConfig(**base, patience=3, eval_every=2)
    result = fit(model, init, data, config, seed=0, progress=False)
    assert result.stopped_early and result.best is not None
    losses = [p.loss for p in result.history]
    assert result.best.loss == min(losses)
    assert result.steps == result.best.step + 3 * 2 < 20 * 6
    assert [p.step for p in result.history] == list(range(2, result.steps + 1, 2))
    assert _val_loss(model, result.params, data) == pytest.approx(result.best.loss, rel=1e-5)
    # The best parameters are exactly those of a run cut at the best step.
    cut_config = TrainConfig(**base, max_steps=result.best.step)
    cut = fit(model, init, data, cut_config, seed=0, progress=False).params
    assert _equal(result.params, cut)


def test_validation_each_epoch_keeps_best_without_patience() -> None:
    data, (model, init) = _toy(), _mlp()
    config = TrainConfig(epochs=3, batch_size=32, eval_every=None, patience=100)
    result = fit(model, init, data, config, progress=False)
    assert [p.step for p in result.history] == [3, 6, 9] and not result.stopped_early
    assert [p.epoch for p in result.history] == [1, 2, 3]
    # eval_every that does not divide the run: the final state is measured too.
    odd_config = TrainConfig(epochs=3, batch_size=32, eval_every=4)
    odd = fit(model, init, data, odd_config, seed=0, progress=False)
    assert [p.step for p in odd.history] == [4, 8, 9]


def test_validation_needs_val_split() -> None:
    data = _toy()
    no_val = Dataset("toy", data.x_train, data.y_train, data.x_test, data.y_test, 2)
    model, init = _mlp()
    with pytest.raises(ValueError, match="validation split"):
        fit(model, init, no_val, TrainConfig(patience=2))
    with pytest.raises(ValueError, match="patience"):
        TrainConfig(patience=0)


class _Bigram(nn.Module):
    """Next-token logits ``(B, T, V)`` from the current token only."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, vocab)

    def forward(self, x: Tensor) -> Tensor:
        return self.emb(x)


def test_language_model_early_stopping_learns_next_token() -> None:
    # Tokens follow t -> (t + 1) mod V: a bigram model can reach zero loss.
    vocab = 7
    stream = torch.arange(400) % vocab
    x, y = stream[:-1].reshape(-1, 7)[:56], stream[1:].reshape(-1, 7)[:56]
    data = Dataset("cyclic", x[:40], y[:40], x[48:], y[48:], vocab, x_val=x[40:48], y_val=y[40:48])
    model = _Bigram(vocab)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    config = TrainConfig(epochs=30, batch_size=8, lr=0.1, patience=2, min_delta=1e-3)
    result = fit(model, init, data, config, progress=False)
    assert result.best is not None and result.best.acc == 1.0
    assert result.best.loss < 0.05 < _val_loss(model, init, data)
