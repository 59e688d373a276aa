"""Tasks as arguments: regression (MSE) through the same training, paths, curvature and soups."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lmckit.data import batches
from lmckit.data._regression import RegressionData
from lmckit.diagnostics._curvature import loss_function, top_hessian_eigenvalue
from lmckit.measure._evaluate import PathResult, evaluate, evaluate_path
from lmckit.paths._curves import fit_curve
from lmckit.training._task import Task, accuracy, cross_entropy, mse
from lmckit.training._train import TrainConfig, fit


def _linear(weight: list[float], bias: float = 0.0) -> tuple[nn.Module, dict]:
    module = nn.Linear(len(weight), 1)
    params = {"weight": torch.tensor([weight]), "bias": torch.tensor([bias])}
    return module, params


def _planted(n: int = 400, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen)
    return x, (x @ torch.tensor([[1.5], [-2.0], [0.5]]) + 0.25)


def test_mse_evaluation_is_the_closed_form_mean_over_uneven_batches() -> None:
    module, params = _linear([1.0, 0.0, 0.0])
    x, y = _planted(50)
    err = x @ torch.tensor([[1.0], [0.0], [0.0]]) - y
    m = evaluate(module, params, batches(x, y, 16), task=mse())  # 16, 16, 16, 2
    assert m.loss == pytest.approx(float((err**2).mean()), rel=1e-5)
    assert m.acc == pytest.approx(float(err.abs().mean()), rel=1e-5)
    assert m.metric == "mae"


def test_fit_with_mse_recovers_planted_weights() -> None:
    x, y = _planted()
    data = RegressionData("planted", x[:300], y[:300], x[300:], y[300:])
    module, init = _linear([0.0, 0.0, 0.0])
    config = TrainConfig(epochs=60, batch_size=32, optimizer="adam", lr=0.05)
    result = fit(module, init, data, config, seed=0, progress=False, task=mse())
    torch.testing.assert_close(
        result.params["weight"], torch.tensor([[1.5, -2.0, 0.5]]), atol=1e-2, rtol=0
    )
    assert float(result.params["bias"]) == pytest.approx(0.25, abs=1e-2)


def test_fit_with_mse_validates_and_keeps_the_best_point() -> None:
    x, y = _planted()
    data = RegressionData(
        "planted", x[:200], y[:200], x[300:], y[300:], x_val=x[200:300], y_val=y[200:300]
    )
    module, init = _linear([0.0, 0.0, 0.0])
    config = TrainConfig(epochs=5, batch_size=50, optimizer="adam", lr=0.05, patience=10)
    result = fit(module, init, data, config, seed=0, progress=False, task=mse())
    assert result.best is not None
    assert result.best.loss == min(p.loss for p in result.history)
    val = evaluate(module, result.params, [data.split("val")], task=mse())
    assert val.loss == pytest.approx(result.best.loss, rel=1e-5)


def test_mse_path_between_two_lines_is_a_closed_form_parabola() -> None:
    # f_t(x) = ((1 - t) a + t b) x; with y = 0 and E[x^2] = s: L(t) = s ((1 - t) a + t b)^2
    module = nn.Linear(1, 1, bias=False)
    pa, pb = {"weight": torch.tensor([[1.0]])}, {"weight": torch.tensor([[-1.0]])}
    x = torch.tensor([[1.0], [2.0], [-3.0]])
    y = torch.zeros(3, 1)
    path = evaluate_path(module, pa, pb, lambda: [(x, y)], points=5, task=mse())
    s = float((x**2).mean())
    assert path.loss == pytest.approx([s * (1 - 2 * t) ** 2 for t in path.t])
    # ends at loss s, midpoint 0: a convex path, no loss barrier; MAE is lowest in the
    # middle too (lower is better), so no metric barrier either
    assert path.barrier_loss == pytest.approx(0.0) and path.barrier_acc == pytest.approx(0.0)
    # the reverse bump: both ends exact, the midpoint off by 1 at every x
    pc, pd = {"weight": torch.tensor([[0.0]])}, {"weight": torch.tensor([[0.0]])}

    def kick(theta: dict, t: float) -> dict:
        return {"weight": theta["weight"] + (1.0 if t == 0.5 else 0.0)}

    bump = evaluate_path(module, pc, pd, lambda: [(x, y)], ts=[0, 0.5, 1], prepare=kick, task=mse())
    assert bump.barrier_acc == pytest.approx(float(x.abs().mean()))
    assert bump.barrier_loss == pytest.approx(s)


def test_path_json_names_the_metric_and_keeps_acc_keys_for_classification() -> None:
    t = [0.0, 0.5, 1.0]
    regression = PathResult(t, [1.0, 2.0, 1.0], [0.5, 0.9, 0.5], {}, "mae", False)
    data = json.loads(regression.to_json())
    assert data["metric"] == "mae" and data["higher_is_better"] is False
    assert data["barrier_mae"] == pytest.approx(0.4) and "acc" not in data
    assert PathResult.from_dict(data) == regression
    classif = PathResult(t, [1.0, 2.0, 1.0], [0.9, 0.5, 0.9]).to_dict()
    assert set(classif) == {
        "t",
        "loss",
        "acc",
        "barrier_loss",
        "barrier_acc",
        "midpoint_loss",
        "midpoint_acc",
        "meta",
    }


def test_curvature_of_mse_is_the_closed_form() -> None:
    # L(w, b) = mean (w.x + b - y)^2 has Hessian 2/N [X 1]^T [X 1] everywhere
    x, y = _planted(64)
    module, params = _linear([0.3, 0.1, -0.2], 0.1)
    loss_fn, trainable = loss_function(
        module, params, [(x[:40], y[:40]), (x[40:], y[40:])], task=mse()
    )
    design = torch.cat([x, torch.ones(64, 1)], 1).double()
    expected = float(torch.linalg.eigvalsh(2 / 64 * design.T @ design).max())
    eig = top_hessian_eigenvalue(loss_fn, trainable, iters=200, tol=1e-10)
    assert eig.value == pytest.approx(expected, rel=1e-4)


def test_curve_fit_with_mse_moves_the_control_point_to_the_minimiser() -> None:
    # both ends fit y = 2x exactly; the quadratic Bezier's loss is zero for all t only when
    # its control point is 2 as well, so training from c = 0 must bring c to 2
    x, y = _planted(256)
    y = 2 * x[:, :1]
    data = RegressionData("line", x[:, :1], y, x[:16, :1], y[:16])
    module = nn.Linear(1, 1, bias=False)
    end = {"weight": torch.tensor([[2.0]])}
    config = TrainConfig(epochs=40, batch_size=32, optimizer="adam", lr=0.05)
    curve = fit_curve(
        module, end, end, data, config, init=[{"weight": torch.zeros(1, 1)}], task=mse()
    )
    assert float(curve.controls[0]["weight"]) == pytest.approx(2.0, abs=0.02)


def test_task_errors() -> None:
    with pytest.raises(ValueError, match="metric_name"):
        Task("bad", cross_entropy, accuracy, metric_name="loss")
    with pytest.raises(ValueError, match="differ in shape"):
        mse().loss(torch.zeros(3, 1), torch.zeros(3))
    with pytest.raises(ValueError, match="floating point"):
        RegressionData(
            "r",
            torch.zeros(4, 2),
            torch.zeros(4, dtype=torch.long),
            *[torch.zeros(2, 2), torch.zeros(2)],
        )
