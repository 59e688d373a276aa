"""Elastic bands: the nudged force's geometry, even re-spacing, pivot insertion, and that a
trained band lowers the barrier of the straight line."""

from __future__ import annotations

import math

import pytest
import torch

from lmckit.data import batches
from lmckit.measure._evaluate import evaluate_path
from lmckit.paths import Band, BandConfig, evaluate_curve, fit_band
from lmckit.paths._band_forces import improved_tangent, nudged_force, redistribute_evenly
from lmckit.symmetry._average import interpolate
from lmckit.training._task import CLASSIFICATION
from lmckit.training._train import TrainConfig


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm()


def test_the_tangent_points_to_the_higher_neighbour_and_mixes_at_an_extremum() -> None:
    coords = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    forward, backward = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])
    # loss rising along the band: the segment ahead; falling: the segment behind
    assert torch.allclose(improved_tangent(coords, torch.tensor([0.0, 1.0, 2.0]), 1), forward)
    assert torch.allclose(improved_tangent(coords, torch.tensor([2.0, 1.0, 0.0]), 1), backward)
    # a maximum at node 1, 3 above the node ahead and 1 above the one behind: Henkelman &
    # Jonsson weigh the segment towards the higher neighbour by the larger step
    mixed = improved_tangent(coords, torch.tensor([2.0, 3.0, 0.0]), 1)
    assert torch.allclose(mixed, _unit(1.0 * forward + 3.0 * backward))


def test_the_nudged_force_keeps_only_the_perpendicular_gradient_and_the_spring() -> None:
    coords = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])  # on the x axis, uneven
    losses = torch.tensor([0.0, 1.0, 2.0])
    grads = torch.tensor([[0.0, 0.0], [5.0, -2.0], [0.0, 0.0]])
    # without a spring (k = inf: even spacing is restored separately) only the part of
    # the gradient across the band remains
    force = nudged_force(coords, losses, grads, math.inf)
    assert torch.allclose(force, torch.tensor([[0.0, 0.0], [0.0, -2.0], [0.0, 0.0]]))
    # a spring k pulls the node towards its farther neighbour: 2 ahead, 1 behind, so
    # descending the force moves it forward by k * (2 - 1)
    force = nudged_force(coords, losses, grads, 0.5)
    assert torch.allclose(force[1], torch.tensor([-0.5, -2.0]))


def test_redistribution_spaces_nodes_evenly_along_the_chain() -> None:
    coords = torch.tensor([[0.0, 0.0], [0.5, 0.0], [2.0, 0.0], [2.0, 2.0]])
    redistribute_evenly(coords)
    # the chain is 4 long: nodes at arc lengths 0, 4/3, 8/3, 4 on the same polyline
    expected = torch.tensor([[0.0, 0.0], [4 / 3, 0.0], [2.0, 2 / 3], [2.0, 2.0]])
    assert torch.allclose(coords, expected, atol=1e-6)


def _pair(mlp_pair):
    return mlp_pair.model, mlp_pair.a, mlp_pair.b


def test_a_band_places_its_pivots_by_arc_length(mlp_pair) -> None:
    model, a, b = _pair(mlp_pair)
    names = tuple(n for n, _ in model.named_parameters())
    pivots = (interpolate(a, b, 0.2), interpolate(a, b, 0.4))
    band = Band(a, pivots, b, names)
    assert band.ts == pytest.approx([0.0, 0.2, 0.4, 1.0], abs=1e-6)
    for t in (0.1, 0.3, 0.7):  # on the straight line, each point is the line's
        for k, v in band.point(t).items():
            torch.testing.assert_close(v, interpolate(a, b, t)[k], atol=1e-5, rtol=1e-5)
    assert all(torch.equal(band.point(band.ts[2])[k], pivots[1][k]) for k in a)


def test_band_config_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="pivots"):
        BandConfig(pivots=0)
    with pytest.raises(ValueError, match="spring"):
        BandConfig(spring=0.0)
    with pytest.raises(ValueError, match="insert"):
        BandConfig(insert=-1)


TRAIN = TrainConfig(epochs=4, batch_size=64, optimizer="sgd", lr=0.1)


def test_a_trained_band_has_a_quarter_of_the_lines_barrier_or_less(mlp_pair) -> None:
    model, a, b = _pair(mlp_pair)
    data = mlp_pair.data
    test = lambda: batches(data.x_test, data.y_test, 500)  # noqa: E731
    line = evaluate_path(model, a, b, test, points=11)
    band = fit_band(model, a, b, data, TRAIN, BandConfig(pivots=3, cycles=2, insert=2))
    assert band.inserted and band.inserted[0] >= 1  # the line's bump got a pivot
    assert len(band.controls) == 3 + band.inserted[0]
    path = evaluate_curve(model, band, test, points=21)
    assert line.barrier_loss > 0.3
    assert path.barrier_loss <= line.barrier_loss / 4
    # the endpoints never move, and the inputs are untouched
    assert all(torch.equal(band.start[k], a[k]) and torch.equal(band.end[k], b[k]) for k in a)
    assert path.loss[0] == pytest.approx(line.loss[0]) and path.loss[-1] == pytest.approx(
        line.loss[-1]
    )


def test_max_seconds_stops_the_band_where_it_is(mlp_pair) -> None:
    model, a, b = _pair(mlp_pair)
    band = fit_band(model, a, b, mlp_pair.data, TRAIN, max_seconds=1e-9)
    assert band.steps == 1 and band.inserted == ()


def test_a_finite_spring_also_trains(mlp_pair) -> None:
    model, a, b = _pair(mlp_pair)
    config = TrainConfig(epochs=1, batch_size=64, optimizer="sgd", lr=0.1, max_steps=20)
    band = fit_band(model, a, b, mlp_pair.data, config, BandConfig(spring=1.0, cycles=1))
    assert band.steps == 20 and len(band.history) == 1 and math.isfinite(band.history[0])


def test_segment_scores_are_the_losses_above_each_segments_chord(mlp_pair) -> None:
    from lmckit.paths._band_growth import BandState, segment_scores
    from lmckit.paths._flat import FlatPacking

    model, a, b = _pair(mlp_pair)
    data = mlp_pair.data
    names = [n for n, _ in model.named_parameters()]
    packing = FlatPacking(names, a)
    mid = interpolate(a, b, 0.5)
    state = BandState(torch.stack([packing.pack(p) for p in (a, mid, b)]), [a, mid, b], packing)
    test = lambda: batches(data.x_test, data.y_test, 500)  # noqa: E731
    nodes, scores = segment_scores(model, state, test, 1, CLASSIFICATION)
    # one probe per segment, at its middle: t = 1/4 and 3/4 of the straight line
    line = evaluate_path(model, a, b, test, ts=[0.0, 0.25, 0.5, 0.75, 1.0]).loss
    assert nodes.tolist() == pytest.approx([line[0], line[2], line[4]], rel=1e-6)
    expected = [line[1] - (line[0] + line[2]) / 2, line[3] - (line[2] + line[4]) / 2]
    assert scores[:, 0].tolist() == pytest.approx(expected, rel=1e-5)
