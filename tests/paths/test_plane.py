"""The plane through three models: the Gram-Schmidt frame on planted geometry, collinear
models refused, and the loss on the plane equal to each model's at its coordinates."""

from __future__ import annotations

import pytest
import torch

from lmckit.data import batches
from lmckit.measure._evaluate import evaluate
from lmckit.merging._merge import reset_batchnorm
from lmckit.models import create_model
from lmckit.paths import PlaneResult, evaluate_plane, plane_frame
from lmckit.paths._plane import plane_axes
from lmckit.symmetry._average import interpolate
from lmckit.training._train import TrainConfig, fit


def _vectors(*rows: list[float]) -> list[dict[str, torch.Tensor]]:
    """Parameter sets of one 2x2 weight and one 1-vector, from 5 numbers each."""
    return [
        {"w": torch.tensor(r[:4], dtype=torch.float32).reshape(2, 2),
         "b": torch.tensor(r[4:], dtype=torch.float32)}
        for r in rows
    ]  # fmt: skip


def test_the_frame_of_planted_vectors() -> None:
    # A at the origin, B 3 along e1, C at (1, 2) in the e1/e2 plane: the frame is e1, e2
    a, b, c = _vectors([0, 0, 0, 0, 0], [3, 0, 0, 0, 0], [1, 2, 0, 0, 0])
    frame = plane_frame(a, b, c)
    assert (frame.b_x, frame.c_x, frame.c_y) == pytest.approx((3.0, 1.0, 2.0))
    point = frame.point([a, b, c], 0.5, -1.5)
    assert torch.allclose(point["w"], torch.tensor([[0.5, -1.5], [0.0, 0.0]]))
    assert torch.allclose(point["b"], torch.zeros(1))


def test_points_and_projections_agree_with_an_explicit_orthonormal_basis() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b, c = ({"w": torch.randn(3, 4, generator=gen), "b": torch.randn(4, generator=gen)}
               for _ in range(3))  # fmt: skip
    flat = [torch.cat([p["w"].reshape(-1), p["b"]]).double() for p in (a, b, c)]
    u = (flat[1] - flat[0]) / (flat[1] - flat[0]).norm()
    v = (flat[2] - flat[0]) - ((flat[2] - flat[0]) @ u) * u
    v = v / v.norm()
    frame = plane_frame(a, b, c)
    for x, y in [(0.3, -0.7), (2.0, 1.5), (-1.0, 0.25)]:
        got = frame.point([a, b, c], x, y)
        expected = flat[0] + x * u + y * v
        assert torch.allclose(torch.cat([got["w"].reshape(-1), got["b"]]).double(), expected,
                              atol=1e-5)  # fmt: skip
        assert frame.project([a, b, c], got) == pytest.approx((x, y), abs=1e-5)
    # every model sits at its coordinates, exactly
    for model, xy in zip((a, b, c), frame.models_xy, strict=True):
        assert all(torch.equal(frame.point([a, b, c], *xy)[k], model[k]) for k in model)


def test_collinear_or_coincident_models_span_no_plane() -> None:
    gen = torch.Generator().manual_seed(1)
    a = {"w": torch.randn(8, 8, generator=gen)}
    b = {"w": torch.randn(8, 8, generator=gen)}
    with pytest.raises(ValueError, match="collinear"):
        plane_frame(a, b, interpolate(a, b, 0.5))  # float32 rounding keeps it on the line
    with pytest.raises(ValueError, match="collinear"):
        plane_frame(a, b, interpolate(a, b, 2.0))  # beyond B, still on the line
    with pytest.raises(ValueError, match="same point"):
        plane_frame(a, a, b)


def test_the_grid_covers_the_models_with_a_margin_and_needs_two_points_per_axis() -> None:
    a, b, c = _vectors([0, 0, 0, 0, 0], [4, 0, 0, 0, 0], [1, 2, 0, 0, 0])
    frame = plane_frame(a, b, c)
    xs, ys = plane_axes(frame, 9, 0.25)
    assert (xs[0], xs[-1], ys[0], ys[-1]) == pytest.approx((-1.0, 5.0, -1.0, 3.0))
    assert len(xs) == len(ys) == 9
    with pytest.raises(ValueError, match="resolution"):
        plane_axes(frame, 1, 0.2)
    with pytest.raises(ValueError, match="margin"):
        plane_axes(frame, 5, -0.1)


def _third(pair, norm: str = "none", seed: int = 2):
    """A third model beside a fixture pair, trained the same way from another seed."""
    model, init = create_model("mlp", seed=seed, in_features=64, hidden=[64, 64],
                               out_features=10, norm=norm)  # fmt: skip
    return fit(model, init, pair.data, TrainConfig(epochs=3, batch_size=64, lr=3e-3), seed=seed,
               progress=False).params  # fmt: skip


def test_the_plane_at_each_model_is_that_model(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    c = _third(mlp_pair)
    frame = plane_frame(a, b, c, names=[n for n, _ in model.named_parameters()])
    xs, ys = plane_axes(frame, 3, 0.1)
    test = lambda: batches(data.x_test, data.y_test, 500)  # noqa: E731
    result = evaluate_plane(model, [a, b, c], frame, test, xs=xs, ys=ys)
    for entry, params in zip(result.models, (a, b, c), strict=True):
        alone = evaluate(model, params, test())
        assert entry["loss"] == pytest.approx(alone.loss, rel=1e-6)
        assert entry["plane_loss"] == pytest.approx(alone.loss, rel=1e-5)
        assert entry["acc"] == entry["plane_acc"] == pytest.approx(alone.acc)
    # a grid point is the model A + x u + y v, evaluated as it is
    corner = evaluate(model, frame.point([a, b, c], xs[2], ys[1]), test())
    assert result.loss[1][2] == pytest.approx(corner.loss, rel=1e-6)
    assert PlaneResult.from_dict(result.to_dict()).loss == result.loss


def test_with_a_batchnorm_reset_the_plane_at_each_model_is_that_model_reset(bn_mlp_pair) -> None:
    model, a, b, data = bn_mlp_pair
    c = _third(bn_mlp_pair, "batch")
    frame = plane_frame(a, b, c, names=[n for n, _ in model.named_parameters()])
    stats = [x for x, _ in batches(data.x_train, data.y_train, 500)]
    test = lambda: batches(data.x_test, data.y_test, 500)  # noqa: E731
    result = evaluate_plane(model, [a, b, c], frame, test, xs=[0.0, frame.b_x],
                            ys=[0.0, frame.c_y],
                            prepare=lambda p, _xy: reset_batchnorm(model, p, stats))  # fmt: skip
    # the geometry ignores the running statistics (they are not trainable) and each point
    # gets its own: at a model, the model with recomputed statistics
    for entry, params in zip(result.models, (a, b, c), strict=True):
        reset = evaluate(model, reset_batchnorm(model, params, stats), test())
        assert entry["plane_loss"] == pytest.approx(reset.loss, rel=1e-5)
        assert entry["loss"] == pytest.approx(evaluate(model, params, test()).loss, rel=1e-6)
