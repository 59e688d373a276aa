"""Bezier curves and polygonal chains: exact geometry, and training lowers the barrier."""

from __future__ import annotations

import pytest
import torch

from lmckit.data import batches, make_gmm
from lmckit.measure._evaluate import evaluate_path
from lmckit.models import create_model
from lmckit.paths import Curve, curve_point, evaluate_curve, fit_curve
from lmckit.paths._curves import linear_init
from lmckit.symmetry._average import interpolate
from lmckit.training._train import TrainConfig, fit


def _pair():
    model, a = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    _, b = create_model("mlp", seed=1, in_features=4, hidden=[6], out_features=3)
    return model, a, b


def _close(p, q) -> bool:
    return all(torch.allclose(p[k], q[k], atol=1e-6) for k in p)


@pytest.mark.parametrize("kind", ["bezier", "chain"])
@pytest.mark.parametrize("bends", [1, 2])
def test_linear_init_traces_the_straight_line(kind, bends):
    _, a, b = _pair()
    curve = Curve(kind, a, linear_init(a, b, bends), b)
    for t in (0.0, 0.2, 0.5, 0.9, 1.0):
        assert _close(curve.point(t), interpolate(a, b, t))


def test_quadratic_bezier_formula_and_chain_nodes():
    _, a, b = _pair()
    c = {k: torch.randn_like(v) for k, v in a.items()}
    t = 0.3
    p = curve_point("bezier", a, [c], b, t)
    for k in a:
        expected = (1 - t) ** 2 * a[k] + 2 * t * (1 - t) * c[k] + t**2 * b[k]
        assert torch.allclose(p[k], expected)
    # a chain passes through its node at t = 1/2 and is linear on each half
    assert _close(curve_point("chain", a, [c], b, 0.5), c)
    assert _close(curve_point("chain", a, [c], b, 0.25), interpolate(a, c, 0.5))
    assert _close(curve_point("chain", a, [c], b, 0.75), interpolate(c, b, 0.5))


def test_gradient_reaches_the_control_point():
    _, a, b = _pair()
    c = {k: v.clone().requires_grad_(True) for k, v in a.items()}
    t = 0.4
    p = curve_point("bezier", a, [c], b, t)
    p["head.bias"].sum().backward()
    assert torch.allclose(c["head.bias"].grad, torch.full_like(a["head.bias"], 2 * t * (1 - t)))


def test_bad_arguments():
    _, a, b = _pair()
    with pytest.raises(ValueError):
        curve_point("spline", a, [a], b, 0.5)
    with pytest.raises(ValueError):
        curve_point("bezier", a, [a], b, 1.5)
    with pytest.raises(ValueError):
        Curve("bezier", a, (), b)
    with pytest.raises(ValueError):
        linear_init(a, b, 0)


def test_evaluate_curve_on_the_line_equals_the_linear_path():
    model, a, b = _pair()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=gen), torch.randint(0, 3, (64,), generator=gen)
    line = evaluate_path(model, a, b, lambda: batches(x, y, 32), points=5)
    curve = evaluate_curve(
        model, Curve("bezier", a, linear_init(a, b), b), lambda: batches(x, y, 32), points=5
    )
    assert curve.loss == pytest.approx(line.loss)
    assert curve.meta["curve"] == "bezier"


@pytest.fixture(scope="module")
def trained_pair():
    """Two small MLPs trained from different seeds on a Gaussian mixture (a loss barrier)."""
    data = make_gmm(dim=8, intrinsic_dim=4, classes=4, n_train=400, n_test=100, seed=0)
    model, init_a = create_model("mlp", seed=0, in_features=8, hidden=[16], out_features=4)
    _, init_b = create_model("mlp", seed=1, in_features=8, hidden=[16], out_features=4)
    cfg = TrainConfig(epochs=10, batch_size=50, optimizer="adam", lr=1e-2)
    a = fit(model, init_a, data, cfg, seed=0, progress=False).params
    b = fit(model, init_b, data, cfg, seed=1, progress=False).params
    return data, model, a, b


@pytest.mark.parametrize("kind", ["bezier", "chain"])
def test_trained_curve_has_lower_barrier_than_the_line(kind, trained_pair):
    data, model, a, b = trained_pair

    def train_batches():
        return batches(data.x_train, data.y_train, 400)

    line = evaluate_path(model, a, b, train_batches, points=11)
    curve = fit_curve(
        model, a, b, data, TrainConfig(epochs=8, batch_size=50, lr=1e-2), kind=kind, seed=0
    )
    on_curve = evaluate_curve(model, curve, train_batches, points=11)
    # the ends are fixed; the trained curve's bump is far below the line's
    assert on_curve.loss[0] == pytest.approx(line.loss[0])
    assert on_curve.loss[-1] == pytest.approx(line.loss[-1])
    assert line.barrier_loss > 0.05
    assert on_curve.barrier_loss < 0.5 * line.barrier_loss
    assert len(curve.history) == 8
    assert all(not v.requires_grad for v in a.values())  # inputs untouched
