"""Barrier formulas on hand-made values, JSON round trips, and paths through real modules."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmckit.evaluate import Metrics, PathResult, evaluate, evaluate_path, linear_grid
from lmckit.models import create_model
from lmckit.params import IncompatibleModelsError, interpolate


def test_loss_barrier_of_a_bump() -> None:
    path = PathResult([0.0, 0.5, 1.0], [1.0, 3.0, 1.0], [0.9, 0.5, 0.9])
    assert path.barrier_loss == pytest.approx(2.0)
    assert path.barrier_acc == pytest.approx(0.4)
    assert path.midpoint_loss == 3.0
    assert path.midpoint_acc == 0.5


def test_barriers_measure_from_the_chord_between_unequal_ends() -> None:
    # chord at t: loss 1 + 2t, acc 0.9 - 0.4t
    t = [0.0, 0.25, 0.5, 0.75, 1.0]
    loss = [1.0, 2.0, 2.5, 2.5, 3.0]  # minus chord: 0, 0.5, 0.5, 0, 0
    acc = [0.9, 0.6, 0.7, 0.3, 0.5]  # chord minus acc: 0, 0.2, 0, 0.3, 0
    path = PathResult(t, loss, acc)
    assert path.barrier_loss == pytest.approx(0.5)
    assert path.barrier_acc == pytest.approx(0.3)


def test_convex_path_has_zero_barrier_not_negative() -> None:
    # the ends are on the chord, so the max is never below 0
    path = PathResult([0.0, 0.5, 1.0], [1.0, 0.2, 1.0], [0.5, 0.9, 0.5])
    assert path.barrier_loss == 0.0
    assert path.barrier_acc == 0.0


def test_midpoint_is_the_grid_point_nearest_half() -> None:
    path = PathResult([0.0, 0.4, 0.7, 1.0], [0.0, 1.0, 2.0, 3.0], [1.0, 0.8, 0.6, 0.4])
    assert path.midpoint_loss == 1.0 and path.midpoint_acc == 0.8


def test_json_round_trip(tmp_path) -> None:
    path = PathResult(
        linear_grid(5), [1.0, 1.5, 2.0, 1.2, 0.9], [0.9, 0.8, 0.7, 0.85, 0.95], {"method": "x"}
    )
    data = json.loads(path.to_json())
    # chords 1 - 0.1 t and 0.9 + 0.05 t: the worst points are both at t = 0.5
    assert data["barrier_loss"] == pytest.approx(1.05)
    assert data["barrier_acc"] == pytest.approx(0.225)
    assert (data["midpoint_loss"], data["midpoint_acc"]) == (2.0, 0.7)
    back = PathResult.from_dict(data)
    assert back == path
    file = tmp_path / "path.json"
    file.write_text(path.to_json())
    assert PathResult.load(file) == path


def test_path_result_errors() -> None:
    with pytest.raises(ValueError, match="both ends"):
        PathResult([0.0, 0.5], [1.0, 2.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="both ends"):
        PathResult([0.1, 1.0], [1.0, 2.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="same length"):
        PathResult([0.0, 0.5, 1.0], [1.0, 2.0], [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="same length"):
        PathResult([0.0], [1.0], [0.5])
    with pytest.raises(ValueError, match="missing 'acc'"):
        PathResult.from_dict({"t": [0.0, 1.0], "loss": [1.0, 1.0]})
    with pytest.raises(ValueError, match="malformed"):
        PathResult.from_dict({"t": None, "loss": [1.0, 1.0], "acc": [1.0, 1.0]})
    with pytest.raises(ValueError, match="at least 2"):
        linear_grid(1)


def test_linear_grid() -> None:
    assert linear_grid(3) == [0.0, 0.5, 1.0]
    grid = linear_grid(11)
    assert len(grid) == 11 and grid[0] == 0.0 and grid[-1] == 1.0
    assert grid[3] == pytest.approx(0.3)


def test_interpolate_hits_the_endpoints_exactly() -> None:
    _, a = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=2, norm="batch")
    _, b = create_model("mlp", seed=1, in_features=4, hidden=[6], out_features=2, norm="batch")
    b["norms.0.num_batches_tracked"] = torch.tensor(9)
    for k in a:
        assert torch.equal(interpolate(a, b, 0.0)[k], a[k])
    for k in a:
        if a[k].is_floating_point():
            assert torch.equal(interpolate(a, b, 1.0)[k], b[k])
    mid = interpolate(a, b, 0.25)
    torch.testing.assert_close(
        mid["head.weight"], 0.75 * a["head.weight"] + 0.25 * b["head.weight"]
    )
    # integer buffers come from the first model
    assert int(mid["norms.0.num_batches_tracked"]) == 0
    assert mid["norms.0.num_batches_tracked"] is not a["norms.0.num_batches_tracked"]


def test_evaluate_matches_direct_cross_entropy() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 4, generator=gen)
    y = torch.randint(0, 3, (30,), generator=gen)
    logits = module(x).detach()
    m = evaluate(module, params, [(x[:13], y[:13]), (x[13:], y[13:])])
    assert m.loss == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    assert m.acc == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    with pytest.raises(ValueError, match="no data"):
        evaluate(module, params, [])


def test_evaluate_restores_training_mode() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    module.train()
    evaluate(module, params, [(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))])
    assert module.training


def test_evaluate_path_of_identical_endpoints_is_flat() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(20, 4, generator=gen), torch.randint(0, 3, (20,), generator=gen))]
    path = evaluate_path(module, params, params, lambda: data, points=5, meta={"k": 1})
    assert path.t == linear_grid(5)
    assert path.barrier_loss == pytest.approx(0.0, abs=1e-7)
    assert path.barrier_acc == pytest.approx(0.0, abs=1e-9)
    assert path.meta == {"k": 1}
    m = evaluate(module, params, data)
    assert path.loss[0] == pytest.approx(m.loss) and path.acc[-1] == pytest.approx(m.acc)


def test_evaluate_path_endpoints_are_the_models(mlp_pair) -> None:
    from lmckit.data import batches

    x, y = mlp_pair.data.x_test, mlp_pair.data.y_test
    path = evaluate_path(
        mlp_pair.model, mlp_pair.a, mlp_pair.b, lambda: batches(x, y, 100), ts=[0.0, 0.5, 1.0]
    )
    end_a = evaluate(mlp_pair.model, mlp_pair.a, batches(x, y, 100))
    end_b = evaluate(mlp_pair.model, mlp_pair.b, batches(x, y, 100))
    assert Metrics(path.loss[0], path.acc[0]) == end_a
    assert Metrics(path.loss[-1], path.acc[-1]) == end_b


def test_evaluate_path_prepare_and_errors() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    data = [(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long))]
    seen: list[float] = []

    def prepare(theta, t):
        seen.append(t)
        return theta

    evaluate_path(module, params, params, lambda: data, ts=[0.0, 0.3, 1.0], prepare=prepare)
    assert seen == [0.0, 0.3, 1.0]
    for bad in ([0.0, 0.5], [0.2, 1.0], [0.0, 0.6, 0.4, 1.0]):
        with pytest.raises(ValueError, match="increase from 0 to 1"):
            evaluate_path(module, params, params, lambda: data, ts=bad)
    _, other = create_model("mlp", seed=0, in_features=4, hidden=[5], out_features=3)
    with pytest.raises(IncompatibleModelsError):
        evaluate_path(module, params, other, lambda: data)
    broken = dict(params)
    broken["head.bias"] = torch.full((3,), float("inf"))
    with pytest.raises(FloatingPointError, match="not finite"):
        evaluate_path(module, params, broken, lambda: data, ts=[0.0, 1.0])


def test_language_model_logits_are_flattened() -> None:
    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(5, 5)

        def forward(self, x):
            return self.emb(x)  # (batch, time, vocab)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lm = TinyLM()
    params = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    x = torch.tensor([[0, 1, 2], [3, 4, 0]])
    y = torch.tensor([[1, 2, 3], [4, 0, 1]])
    m = evaluate(lm, params, [(x, y)])
    expected = F.cross_entropy(params["emb.weight"][x].reshape(-1, 5), y.reshape(-1))
    assert m.loss == pytest.approx(float(expected), rel=1e-5)
