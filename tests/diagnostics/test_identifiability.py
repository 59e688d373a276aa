"""Identifiability diagnostics against closed forms and brute force."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lmckit.diagnostics._identifiability import (
    activation_matching_objectives,
    center_gaps,
    chord_deviation,
    coherence,
    collect_layer_inputs,
    gram_anisotropy,
    input_subspace,
    matching_objective,
    min_center_gap,
    overall_objective,
    realization_cost,
    realization_cost_matrix,
    ridge_cost_matrix,
    swap_costs,
)
from lmckit.models import create_model
from lmckit.symmetry._transform import Transform, apply


def _layer(seed: int, *, d: int = 10, k: int = 3, n: int = 5, keep: float = 0.6):
    """Random subspace basis ``(d, k)``, data on it, and an asymmetric layer of ``n`` rows."""
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))
    x = torch.randn(400, k, generator=gen, dtype=torch.float64) @ basis.T
    masks = (torch.rand(n, d, generator=gen) < keep).double()
    offsets = (1 - masks) * torch.randn(n, d, generator=gen, dtype=torch.float64)
    weights = masks * torch.randn(n, d, generator=gen, dtype=torch.float64) + offsets
    return basis, x, masks, offsets, weights


@pytest.mark.parametrize("seed", range(4))
def test_realization_cost_matches_brute_force_least_squares(seed: int) -> None:
    """``min ||v||² s.t. X(m ⊙ v + c) = X w_j`` by a minimum-norm least-squares solve."""
    basis, x, masks, offsets, weights = _layer(seed)
    costs = realization_cost_matrix(basis, masks, offsets, weights)
    for i in range(masks.shape[0]):
        a = x * masks[i]  # X diag(m_i): (N, d)
        for j in range(masks.shape[0]):
            rhs = x @ (weights[j] - offsets[i])
            v = torch.linalg.pinv(a) @ rhs  # the minimum-norm solution
            feasible = torch.allclose(a @ v, rhs, atol=1e-8 * (1 + rhs.abs().max()))
            if feasible:
                assert costs[i, j] == pytest.approx(float(v @ v), rel=1e-6)
            else:
                assert math.isinf(costs[i, j])
    assert torch.isfinite(costs.diagonal()).all()  # a neuron can always realise itself
    single = realization_cost(basis, masks[1], offsets[1], weights[2])
    assert single == pytest.approx(float(costs[1, 2]))


def test_masked_direction_is_unrealizable_example_4_3() -> None:
    """Inputs on span(e_1, e_2); a neuron masking e_2 cannot read the second direction."""
    basis = torch.eye(4, dtype=torch.float64)[:, :2]
    masks = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    offsets = torch.zeros(2, 4, dtype=torch.float64)
    weights = torch.tensor([[2.0, 0.0, 0.0, 0.0], [1.0, 3.0, 0.0, 0.0]], dtype=torch.float64)
    costs = realization_cost_matrix(basis, masks, offsets, weights)
    assert math.isinf(costs[0, 1])  # neuron 1 reads e_2, neuron 0 cannot
    assert costs[1, 0] == pytest.approx(4.0) and costs[1, 1] == pytest.approx(10.0)
    assert math.isinf(gram_anisotropy(basis, masks)[0]) and gram_anisotropy(basis, masks)[1] == 1


def test_ridge_cost_tends_to_the_hard_cost_from_below() -> None:
    basis, x, masks, offsets, weights = _layer(7, keep=0.8)
    hard = realization_cost_matrix(basis, masks, offsets, weights)
    finite = torch.isfinite(hard)
    previous = None
    for ridge in (1e-1, 1e-3, 1e-6, 1e-9):
        relaxed = ridge_cost_matrix(x, masks, offsets, weights, ridge=ridge)
        # the hard minimiser is feasible for the ridge problem: relaxed <= hard
        assert torch.all(relaxed[finite] <= hard[finite] * (1 + 1e-6) + 1e-9)
        if previous is not None:  # the relaxed cost grows as the ridge shrinks
            assert torch.all(relaxed >= previous * (1 - 1e-6))
        previous = relaxed
    torch.testing.assert_close(previous[finite], hard[finite], rtol=1e-4, atol=1e-6)
    assert torch.all(previous[~finite] > 1e3 * hard[finite].max())


def test_swap_costs_vanish_without_asymmetry_and_match_the_syre_closed_form() -> None:
    basis, _, _, _, weights = _layer(3)
    ones = torch.ones_like(weights)
    # a plain layer: every neuron realises beta at ||beta||²; swaps cost nothing
    plain = swap_costs(realization_cost_matrix(basis, ones, torch.zeros_like(weights), weights))
    torch.testing.assert_close(plain, torch.zeros_like(plain), atol=1e-9, rtol=0)
    # syre (M = 1, G = I): Δ_ij = 2 (a_i - a_j)ᵀ (β_i - β_j)
    gen = torch.Generator().manual_seed(4)
    offsets = torch.randn(weights.shape, generator=gen, dtype=torch.float64)
    delta = swap_costs(realization_cost_matrix(basis, ones, offsets, weights))
    a, beta = offsets @ basis, weights @ basis
    diff_a, diff_b = a[:, None] - a[None], beta[:, None] - beta[None]
    torch.testing.assert_close(delta, 2 * (diff_a * diff_b).sum(-1))
    torch.testing.assert_close(delta, delta.T)


def test_center_gap_against_brute_force() -> None:
    basis, _, _, offsets, _ = _layer(5, n=6)
    centers = offsets @ basis
    brute = min(
        float((centers[i] - centers[j]).norm()) for i in range(6) for j in range(6) if i != j
    )
    assert min_center_gap(basis, offsets) == pytest.approx(brute)
    assert center_gaps(basis, offsets).shape == (6, 6)


@pytest.mark.parametrize("copies", [1, 2, 5, 8])
def test_coherence_of_exact_copies_is_one_over_copies(copies: int) -> None:
    basis = torch.zeros(2 * copies + 3, 2)
    basis[:copies, 0] = 1 / math.sqrt(copies)
    basis[copies : 2 * copies, 1] = 1 / math.sqrt(copies)
    assert coherence(basis) == pytest.approx(1 / copies)


def test_coherence_bounds_and_basis_independence() -> None:
    gen = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(20, 4, generator=gen))
    rotation, _ = torch.linalg.qr(torch.randn(4, 4, generator=gen))
    mu = coherence(basis)
    assert 4 / 20 <= mu <= 1
    assert coherence(basis @ rotation) == pytest.approx(mu, rel=1e-5)
    assert coherence(torch.eye(20)[:, :4]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="orthonormal"):
        coherence(2 * basis)


def test_input_subspace_recovers_the_data_subspace() -> None:
    basis, x, *_ = _layer(2, d=12, k=4)
    found = input_subspace(x.float(), explained=0.999)
    assert found.shape == (12, 4)
    torch.testing.assert_close(
        found.double() @ found.double().T, basis @ basis.T, atol=1e-4, rtol=0
    )
    # a lower explained variance keeps fewer directions
    assert input_subspace(x.float(), explained=0.3).shape[1] < 4
    with pytest.raises(ValueError, match="explained"):
        input_subspace(x.float(), explained=0.0)


def test_gram_anisotropy_is_one_for_full_masks() -> None:
    basis, *_ = _layer(1)
    ratio = gram_anisotropy(basis, torch.ones(3, basis.shape[0]))
    torch.testing.assert_close(ratio, torch.ones(3, dtype=torch.float64))


def _mlp(seed: int = 0):
    return create_model("mlp", seed=seed, in_features=6, hidden=[16, 16], out_features=3)


def test_identity_is_optimal_for_a_model_compared_with_itself() -> None:
    model, params = _mlp()
    inputs = [torch.randn(64, 6, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    spec = model.symmetry_spec()
    per_space = activation_matching_objectives(model, spec, params, params, inputs, random=100)
    for obj in per_space.values():
        assert obj.identity == pytest.approx(obj.optimal)
        # dead ReLU units correlate with nothing, so the value is the live fraction
        assert obj.identity > obj.random_mean + 0.5
        assert obj.identity_gap == pytest.approx(0.0, abs=1e-9)
    # a permuted copy: the optimum is unchanged and found, the identity falls
    flip = Transform(
        spec,
        {s.name: torch.randperm(s.n, generator=torch.Generator().manual_seed(1)) for s in spec},
    )
    moved = apply(spec, params, flip)
    permuted = activation_matching_objectives(model, spec, params, moved, inputs, random=100)
    overall, reference = overall_objective(permuted), overall_objective(per_space)
    assert overall.optimal == pytest.approx(reference.optimal, abs=1e-4)
    assert overall.identity < reference.identity - 0.3


def test_matching_objective_of_a_known_matrix() -> None:
    corr = torch.tensor([[0.1, 0.9], [0.8, 0.2]])
    obj = matching_objective(corr, random=200)
    assert obj.identity == pytest.approx(0.15) and obj.optimal == pytest.approx(0.85)
    assert obj.random_mean == pytest.approx(0.5, abs=0.08)
    with pytest.raises(ValueError, match="square"):
        matching_objective(torch.zeros(2, 3))


def test_chord_deviation() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 6, generator=gen)
    linear = nn.Linear(6, 4)
    pa = {k: torch.randn(v.shape, generator=gen) for k, v in linear.state_dict().items()}
    pb = {k: torch.randn(v.shape, generator=gen) for k, v in linear.state_dict().items()}
    # affine in its parameters: the path is its own chord
    assert max(chord_deviation(linear, pa, pb, x)) < 1e-10
    relu = nn.Sequential(nn.Linear(6, 4), nn.ReLU())
    qa = {f"0.{k}": v for k, v in pa.items()}
    qb = {f"0.{k}": v for k, v in pb.items()}
    dev = chord_deviation(relu, qa, qb, x, ts=(0.0, 0.5, 1.0))
    assert dev[0] == pytest.approx(0.0, abs=1e-10) and dev[2] == pytest.approx(0.0, abs=1e-10)
    assert dev[1] > 1e-3  # gates flip along the path
    assert max(chord_deviation(relu, qa, qa, x)) < 1e-10


def test_collect_layer_inputs() -> None:
    model, params = _mlp()
    x = torch.randn(10, 6)
    seen = collect_layer_inputs(model, params, [x, x], "layers.0")
    torch.testing.assert_close(seen, torch.cat([x, x]))
    assert collect_layer_inputs(model, params, [x], "head").shape == (10, 16)
