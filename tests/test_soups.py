"""Uniform and greedy model soups."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmckit.data import batches, make_gmm
from lmckit.merging._soups import greedy_soup, uniform_soup
from lmckit.models import create_model
from lmckit.symmetry._average import interpolate
from lmckit.training._task import Task, classification, mse
from lmckit.training._train import TrainConfig, fit


def test_uniform_soup_closed_forms():
    _, a = create_model("mlp", seed=0, in_features=4, hidden=[5], out_features=2)
    _, b = create_model("mlp", seed=1, in_features=4, hidden=[5], out_features=2)
    mid = interpolate(a, b, 0.5)
    soup = uniform_soup([a, b])
    assert all(torch.allclose(soup[k], mid[k]) for k in a)
    same = uniform_soup([a, a, a])
    assert all(torch.allclose(same[k], a[k]) for k in a)
    with pytest.raises(ValueError):
        uniform_soup([])


def test_greedy_soup_keeps_fine_tunes_and_drops_a_bad_ingredient():
    data = make_gmm(dim=8, intrinsic_dim=4, classes=3, n_train=300, n_test=300, seed=0)
    model, init = create_model("mlp", seed=0, in_features=8, hidden=[16], out_features=3)
    cfg = TrainConfig(epochs=5, batch_size=50, optimizer="adam", lr=1e-2)
    base = fit(model, init, data, cfg, seed=0, progress=False).params
    # two short fine-tunes of one model (same basin) and an untrained model
    tune = TrainConfig(epochs=1, batch_size=50, optimizer="adam", lr=1e-3)
    ingredients = [fit(model, base, data, tune, seed=s, progress=False).params for s in (1, 2)]
    _, bad = create_model("mlp", seed=5, in_features=8, hidden=[16], out_features=3)
    ingredients.append(bad)
    soup = greedy_soup(model, ingredients, lambda: batches(data.x_test, data.y_test, 100))
    assert soup.members and 2 not in soup.members  # never the untrained model
    expected = uniform_soup([ingredients[i] for i in soup.members])
    assert all(torch.allclose(soup.params[k], expected[k]) for k in expected)


def _scored_soup(task: Task, models: list[dict], x, y):
    module = nn.Linear(1, models[0]["weight"].shape[0])
    return greedy_soup(module, models, lambda: [(x, y)], task=task)


def test_greedy_soup_adds_a_worse_ingredient_that_helps_and_drops_one_that_hurts() -> None:
    # 1-D classifier "class 1 iff a x + c > 0" as logits (0, a x + c); labels: x > 0.
    # thresholds -c/a: 1.5 (acc 0.8), -2.5 (0.6), 7.5 (0.4); the first two average to
    # -0.5 (acc 1.0); all three to 2.17 (acc 0.6)
    def clf(a: float, c: float) -> dict:
        return {"weight": torch.tensor([[0.0], [a]]), "bias": torch.tensor([0.0, c])}

    x = torch.tensor([[-2.0], [-1.0], [1.0], [2.0], [3.0]])
    y = torch.tensor([0, 0, 1, 1, 1])
    soup = _scored_soup(classification(), [clf(1, -7.5), clf(1, -1.5), clf(1, 2.5)], x, y)
    assert [m.acc for m in soup.ingredient_metrics] == pytest.approx([0.4, 0.8, 0.6])
    assert soup.members == [1, 2]
    assert soup.metrics.acc == 1.0
    torch.testing.assert_close(soup.params["bias"], torch.tensor([0.0, 0.5]))


def test_greedy_soup_follows_a_metric_where_lower_is_better() -> None:
    # y = 2x; slopes 3, 1.5, 0.5 have MAE proportional to 1, 0.5, 1.5; 1.5 and 3 average
    # to 2.25 (0.25, kept), all three to 1.67 (0.33, dropped)
    x = torch.tensor([[1.0], [-2.0], [3.0]])
    models = [{"weight": torch.tensor([[w]]), "bias": torch.zeros(1)} for w in (3.0, 1.5, 0.5)]
    soup = _scored_soup(mse(), models, x, 2 * x)
    assert soup.members == [1, 0]
    assert soup.metrics.acc == pytest.approx(0.25 * float(x.abs().mean()))
