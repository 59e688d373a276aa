"""Width diagnostics on cases with closed-form answers."""

from __future__ import annotations

import math

import pytest
import torch

from lmckit.diagnostics._width import (
    effective_rank,
    lewc_cosine,
    mean_cosine,
    reciprocal_orthogonality,
    reciprocal_orthogonality_per_layer,
    weak_additivity,
    weak_additivity_per_layer,
)
from lmckit.models import create_model

HIDDEN = 6


def _disjoint_pair():
    """Two bias-free MLPs whose hidden units are disjoint: A uses the first half, B the rest.

    Then ``W_a z_b = 0`` exactly, the ReLU sees disjoint supports, and LEWC holds exactly.
    """
    model, a = create_model(
        "mlp", seed=0, in_features=5, hidden=[2 * HIDDEN] * 2, out_features=3, bias=False
    )
    _, b = create_model(
        "mlp", seed=1, in_features=5, hidden=[2 * HIDDEN] * 2, out_features=3, bias=False
    )
    a, b = dict(a), dict(b)
    first, second = slice(0, HIDDEN), slice(HIDDEN, 2 * HIDDEN)
    a["layers.0.weight"] = a["layers.0.weight"].clone()
    a["layers.0.weight"][second] = 0
    b["layers.0.weight"] = b["layers.0.weight"].clone()
    b["layers.0.weight"][first] = 0
    for name, keep in (("layers.1.weight", first), ("head.weight", first)):
        w = torch.zeros_like(a[name])
        if name == "head.weight":
            w[:, keep] = a[name][:, keep]
        else:
            w[keep, keep] = a[name][keep, keep]
        a[name] = w
    for name, keep in (("layers.1.weight", second), ("head.weight", second)):
        w = torch.zeros_like(b[name])
        if name == "head.weight":
            w[:, keep] = b[name][:, keep]
        else:
            w[keep, keep] = b[name][keep, keep]
        b[name] = w
    return model, a, b


def test_weak_additivity_closed_forms():
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(4, 7, generator=gen)
    v = torch.rand(4, 7, generator=gen)
    assert weak_additivity(u, v) == pytest.approx(1.0)  # both non-negative: relu is linear
    # u + (-u) = 0 while relu(u) + relu(-u) = |u| != 0: cosine 0
    assert weak_additivity(u + 0.1, -(u + 0.1)) == pytest.approx(0.0)


def test_mean_cosine_scale_invariant_and_bounded():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 3, 2, generator=gen)
    assert mean_cosine(x, 3.0 * x) == pytest.approx(1.0)
    assert mean_cosine(x, -x) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        mean_cosine(x, x[:, :2])


def test_reciprocal_orthogonality_null_space_and_identity():
    gen = torch.Generator().manual_seed(0)
    w = torch.zeros(4, 6)
    w[:, :3] = torch.randn(4, 3, generator=gen)
    z_own = torch.randn(10, 6, generator=gen)
    z_null = torch.zeros(10, 6)
    z_null[:, 3:] = torch.randn(10, 3, generator=gen)  # in the null space of w
    assert reciprocal_orthogonality(w, z_own, z_null) == pytest.approx(0.0)
    assert reciprocal_orthogonality(w, z_own, z_own) == pytest.approx(1.0)
    assert reciprocal_orthogonality(w, z_own, 2 * z_own) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        reciprocal_orthogonality(w, z_own[:, :5], z_null)


def test_effective_rank_closed_forms():
    gen = torch.Generator().manual_seed(0)
    assert effective_rank(torch.eye(5)) == pytest.approx(5.0)
    assert effective_rank(
        torch.outer(torch.randn(4, generator=gen), torch.randn(6, generator=gen))
    ) == pytest.approx(1.0, abs=1e-6)
    # singular values (2, 1, 1): p = (1/2, 1/4, 1/4), H = 1.5 log 2
    assert effective_rank(torch.diag(torch.tensor([2.0, 1.0, 1.0]))) == pytest.approx(
        math.exp(1.5 * math.log(2))
    )
    with pytest.raises(ValueError):
        effective_rank(torch.zeros(3, 3))


def test_disjoint_networks_satisfy_lewc_exactly():
    gen = torch.Generator().manual_seed(0)
    model, a, b = _disjoint_pair()
    x = torch.randn(16, 5, generator=gen)
    sites = ["acts.0", "acts.1", "head"]
    for lam in (0.5, 0.3):
        cos = lewc_cosine(model, a, b, x, sites, lam=lam)
        assert all(v == pytest.approx(1.0, abs=1e-9) for v in cos.values()), cos
    ro = reciprocal_orthogonality_per_layer(model, a, b, x, ["layers.1", "head"])
    assert all(v == pytest.approx(0.0, abs=1e-12) for v in ro.values()), ro
    wa = weak_additivity_per_layer(model, a, b, x, ["acts.0", "acts.1"])
    assert all(v == pytest.approx(1.0) for v in wa.values()), wa


def test_lewc_first_layer_is_exact_for_any_pair():
    gen = torch.Generator().manual_seed(0)
    # layer 1 before the nonlinearity is affine in the parameters: exact for any models
    model, a = create_model("mlp", seed=0, in_features=5, hidden=[8, 8], out_features=3)
    _, b = create_model("mlp", seed=1, in_features=5, hidden=[8, 8], out_features=3)
    cos = lewc_cosine(model, a, b, torch.randn(16, 5, generator=gen), ["layers.0"], lam=0.5)
    # lam^1 f(a) + (1 - lam)^1 f(b) is the merged pre-activation itself
    assert cos["layers.0"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        lewc_cosine(model, a, b, torch.randn(4, 5, generator=gen), ["layers.0"], lam=1.5)


def test_unrelated_models_are_not_reciprocally_orthogonal():
    gen = torch.Generator().manual_seed(0)
    model, a = create_model("mlp", seed=0, in_features=5, hidden=[8, 8], out_features=3)
    ro = reciprocal_orthogonality_per_layer(
        model, a, a, torch.randn(16, 5, generator=gen), ["layers.1"]
    )
    assert ro["layers.1"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        reciprocal_orthogonality_per_layer(
            model, a, a, torch.randn(4, 5, generator=gen), ["acts.0"]
        )
