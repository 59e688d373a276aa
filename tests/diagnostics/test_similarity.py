"""Linear CKA on representations with known answers."""

from __future__ import annotations

import pytest
import torch

from lmckit.diagnostics._similarity import endpoint_cka, linear_cka, path_cka
from lmckit.models import create_model
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import apply


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_identical_representations_give_one():
    x = torch.randn(20, 7, generator=_gen())
    assert linear_cka(x, x) == pytest.approx(1.0)


def test_invariant_to_orthogonal_maps_and_isotropic_scaling():
    x = torch.randn(30, 6, generator=_gen())
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=_gen(1)))
    assert linear_cka(x, 3.0 * x @ q) == pytest.approx(1.0)
    assert linear_cka(x, x + 5.0) == pytest.approx(1.0)  # centring removes offsets


def test_one_feature_gives_squared_correlation():
    x = torch.randn(50, 1, generator=_gen())
    y = 0.5 * x + torch.randn(50, 1, generator=_gen(1))
    r = torch.corrcoef(torch.cat([x, y], 1).T)[0, 1]
    assert linear_cka(x, y) == pytest.approx(float(r) ** 2)


def test_gram_and_feature_forms_agree():
    # n*n < p*q uses the Gram form; transposing the problem's shape uses the feature form
    x = torch.randn(5, 40, generator=_gen())
    y = torch.randn(5, 30, generator=_gen(1))
    a, b = x - x.mean(0), y - y.mean(0)
    expected = (b.T @ a).pow(2).sum() / ((a.T @ a).norm() * (b.T @ b).norm())
    assert linear_cka(x, y) == pytest.approx(float(expected))


def test_independent_noise_is_dissimilar():
    x = torch.randn(2000, 3, generator=_gen())
    y = torch.randn(2000, 3, generator=_gen(1))
    assert linear_cka(x, y) < 0.01
    with pytest.raises(ValueError):
        linear_cka(x, y[:10])


def test_permuted_model_has_cka_one_and_linear_path_starts_at_one():
    model, a = create_model("mlp", seed=0, in_features=5, hidden=[8, 8], out_features=3)
    _, b = create_model("mlp", seed=1, in_features=5, hidden=[8, 8], out_features=3)
    spec = model.symmetry_spec()
    permuted = apply(spec, a, random_transform(spec, 3))
    x = torch.randn(40, 5, generator=_gen())
    sites = ["acts.0", "acts.1"]
    assert all(v == pytest.approx(1.0) for v in endpoint_cka(model, a, permuted, x, sites).values())
    result = path_cka(model, lambda t: interpolate(a, b, t), x, sites, [0.0, 0.5, 1.0])
    for s in sites:
        assert result.to_a[s][0] == pytest.approx(1.0)
        assert result.to_b[s][-1] == pytest.approx(1.0)
        assert result.to_a[s][-1] == pytest.approx(result.to_b[s][0])  # CKA is symmetric
