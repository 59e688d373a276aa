"""Uniform and greedy model soups."""

from __future__ import annotations

import pytest
import torch

from lmckit.data import batches, make_gmm
from lmckit.models import create_model
from lmckit.params import interpolate
from lmckit.soups import greedy_soup, uniform_soup
from lmckit.train import TrainConfig, train


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
    base = train(model, init, data, cfg, seed=0, progress=False)
    # two short fine-tunes of one model (same basin) and an untrained model
    tune = TrainConfig(epochs=1, batch_size=50, optimizer="adam", lr=1e-3)
    ingredients = [train(model, base, data, tune, seed=s, progress=False) for s in (1, 2)]
    _, bad = create_model("mlp", seed=5, in_features=8, hidden=[16], out_features=3)
    ingredients.append(bad)
    soup = greedy_soup(model, ingredients, lambda: batches(data.x_test, data.y_test, 100))
    assert 2 not in soup.members
    assert soup.members[0] == max(range(3), key=lambda i: soup.ingredient_metrics[i].acc)
    assert soup.metrics.acc >= max(m.acc for m in soup.ingredient_metrics)
    expected = uniform_soup([ingredients[i] for i in soup.members])
    assert all(torch.allclose(soup.params[k], expected[k]) for k in expected)
