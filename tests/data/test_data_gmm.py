"""Synthetic Gaussian mixtures."""

from __future__ import annotations

import pytest
import torch

from lmckit.data import make_gmm


def test_shapes_and_balance() -> None:
    ds = make_gmm(dim=20, intrinsic_dim=5, classes=4, n_train=103, n_test=41)
    assert ds.name == "gmm"
    assert ds.x_train.shape == (103, 20) and ds.x_test.shape == (41, 20)
    assert ds.input_shape == (20,)
    assert ds.num_classes == 4
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    counts = torch.bincount(ds.y_train, minlength=4)
    assert int(counts.max() - counts.min()) <= 1


def test_deterministic_per_seed() -> None:
    a, b, c = make_gmm(seed=1), make_gmm(seed=1), make_gmm(seed=2)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.x_train, c.x_train)


def test_noise_free_data_lies_in_intrinsic_subspace() -> None:
    ds = make_gmm(dim=32, intrinsic_dim=6, n_train=500, n_test=100, noise=0.0)
    x = torch.cat([ds.x_train, ds.x_test]).double()
    assert int(torch.linalg.matrix_rank(x, rtol=1e-5)) == 6
    # Train and test share one subspace: projecting onto the train span loses nothing.
    u, _, _ = torch.linalg.svd(ds.x_train.double().T, full_matrices=False)
    basis = u[:, :6]
    test = ds.x_test.double()
    residual = test - test @ basis @ basis.T
    assert float(residual.norm() / test.norm()) < 1e-5


def test_noise_fills_ambient_space_and_keeps_clean_points() -> None:
    clean = make_gmm(dim=16, intrinsic_dim=3, n_train=200, n_test=50, noise=0.0)
    noisy = make_gmm(dim=16, intrinsic_dim=3, n_train=200, n_test=50, noise=0.1)
    assert int(torch.linalg.matrix_rank(noisy.x_train.double())) == 16
    assert torch.equal(clean.y_train, noisy.y_train)
    diff = noisy.x_train - clean.x_train
    assert abs(float(diff.std()) - 0.1) < 0.01


def test_separation_makes_classes_separable() -> None:
    ds = make_gmm(dim=10, intrinsic_dim=4, classes=3, n_train=600, separation=8.0)
    means = torch.stack([ds.x_train[ds.y_train == k].mean(0) for k in range(3)])
    nearest = torch.cdist(ds.x_test, means).argmin(1)
    assert float((nearest == ds.y_test).float().mean()) > 0.95


def test_global_rng_untouched() -> None:
    state = torch.get_rng_state()
    make_gmm(n_train=10, n_test=10)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dim": 4, "intrinsic_dim": 5},
        {"intrinsic_dim": 0},
        {"classes": 0},
        {"n_test": 0},
        {"noise": -1.0},
        {"separation": -0.5},
    ],
)
def test_bad_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        make_gmm(**kwargs)  # type: ignore[arg-type]
