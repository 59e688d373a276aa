"""Simplex grids, multi-model barriers (closed forms), JSON and the triangle plot."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lmckit.data import Dataset, batches
from lmckit.measure._evaluate import evaluate_path, linear_grid
from lmckit.measure._plot import plot_simplex
from lmckit.paths import SimplexResult, evaluate_simplex, simplex_grid


def test_grid_counts_sums_and_vertices() -> None:
    grid = simplex_grid(3, 10)
    assert len(grid) == 66
    assert all(abs(sum(w) - 1) < 1e-12 and min(w) >= 0 for w in grid)
    for vertex in [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)]:
        assert vertex in grid
    assert len(simplex_grid(4, 3)) == 20  # C(3 + 3, 3)
    assert simplex_grid(2, 4) == [(1.0, 0.0), (0.75, 0.25), (0.5, 0.5), (0.25, 0.75), (0.0, 1.0)]
    with pytest.raises(ValueError):
        simplex_grid(1, 10)
    with pytest.raises(ValueError):
        simplex_grid(3, 0)


def test_barriers_closed_form() -> None:
    grid = simplex_grid(3, 2)
    # L(w) = chord + 0.3 at the centre-most points, chord elsewhere
    ends = [1.0, 2.0, 4.0]
    loss = [
        sum(w * e for w, e in zip(ws, ends, strict=True)) + (0.3 if max(ws) < 1 else 0.0)
        for ws in grid
    ]
    acc = [0.9 - (0.1 if max(ws) < 1 else 0.0) for ws in grid]
    result = SimplexResult(grid, loss, acc)
    assert result.barrier_loss == pytest.approx(0.3)
    assert result.barrier_acc == pytest.approx(0.1)
    assert result.vertex_loss == ends
    assert max(result.argmax_loss) < 1


def test_identical_models_have_zero_barrier(mlp_pair, digits: Dataset) -> None:
    model, a, _, _ = mlp_pair
    test = lambda: batches(digits.x_test, digits.y_test, 500)  # noqa: E731
    result = evaluate_simplex(model, [a, a, a], test, resolution=3)
    assert result.barrier_loss == pytest.approx(0.0, abs=1e-5)
    assert result.barrier_acc == pytest.approx(0.0, abs=1e-9)


def test_two_model_simplex_is_the_linear_path(mlp_pair, digits: Dataset) -> None:
    model, a, b, _ = mlp_pair
    test = lambda: batches(digits.x_test, digits.y_test, 500)  # noqa: E731
    simplex = evaluate_simplex(model, [a, b], test, resolution=4)
    line = evaluate_path(model, a, b, test, ts=linear_grid(5))
    assert simplex.barrier_loss == pytest.approx(line.barrier_loss, abs=1e-5)
    # grid runs from vertex a (w = (1, 0)) to vertex b
    assert simplex.loss == pytest.approx(line.loss, abs=1e-5)


def test_json_round_trip(tmp_path: Path) -> None:
    grid = simplex_grid(3, 2)
    result = SimplexResult(grid, [float(i) for i in range(6)], [0.5] * 6, {"align": "none"})
    path = tmp_path / "s.json"
    path.write_text(result.to_json())
    back = SimplexResult.load(path)
    assert back.weights == result.weights and back.loss == result.loss
    assert back.meta == {"align": "none"}
    assert back.to_dict()["barrier_loss"] == result.barrier_loss


def test_invalid_results_are_value_errors() -> None:
    with pytest.raises(ValueError, match="convex"):
        SimplexResult([(0.5, 0.6), (1.0, 0.0), (0.0, 1.0)], [1, 2, 3], [0, 0, 0])
    with pytest.raises(ValueError, match="vertex"):
        SimplexResult([(0.5, 0.5), (1.0, 0.0)], [1, 2], [0, 0])
    with pytest.raises(ValueError, match="^simplex result is missing 'weights'$"):
        SimplexResult.from_dict({"loss": []})
    # a hand-edited file: a null where a list belongs is a one-line error, no traceback
    with pytest.raises(ValueError, match="^simplex result is malformed: "):
        SimplexResult.from_dict({"weights": [[1.0, 0.0], [0.0, 1.0]], "loss": None, "acc": [1, 1]})


def test_inputs_are_not_modified(mlp_pair, digits: Dataset) -> None:
    model, a, b, _ = mlp_pair
    before = {k: v.clone() for k, v in a.items()}
    evaluate_simplex(
        model, [a, b, b], lambda: batches(digits.x_test, digits.y_test, 500), resolution=2
    )
    assert all(torch.equal(a[k], before[k]) for k in a)


def test_plot_simplex_writes_a_png(tmp_path: Path) -> None:
    grid = simplex_grid(3, 4)
    result = SimplexResult(grid, [sum(w) + w[0] * w[1] for w in grid], [0.9] * len(grid))
    out = plot_simplex({"a": result, "b": result}, tmp_path / "tri.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    two = SimplexResult(simplex_grid(2, 2), [1.0, 2.0, 1.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="3 models"):
        plot_simplex({"two": two}, tmp_path / "bad.png")


def test_batched_grid_equals_the_point_loop(mlp_pair, digits: Dataset, caplog) -> None:
    import logging

    from lmckit.measure._batched import Batching

    model, a, b, _ = mlp_pair
    c = {k: v.flip(0) if v.ndim else v for k, v in a.items()}  # a third, different model
    test = lambda: batches(digits.x_test, digits.y_test, 100)  # noqa: E731
    loop = evaluate_simplex(model, [a, b, c], test, resolution=3, batching=Batching("loop"))
    with caplog.at_level(logging.DEBUG, logger="lmckit.measure._batched"):
        batched = evaluate_simplex(
            model, [a, b, c], test, resolution=3, batching=Batching("batched", points_per_call=4)
        )
    assert "evaluated 10 points batched, 4 per call" in caplog.text
    assert batched.weights == loop.weights
    assert batched.loss == pytest.approx(loop.loss, rel=1e-5, abs=1e-5)
    assert batched.acc == pytest.approx(loop.acc, abs=1e-5)
    assert batched.barrier_loss == pytest.approx(loop.barrier_loss, abs=1e-5)
    assert loop.barrier_loss > 0.01  # a real barrier, not a flat grid
