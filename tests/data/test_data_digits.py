"""scikit-learn digits loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmckit.data import load_digits


def test_shapes_and_standardisation() -> None:
    ds = load_digits()
    assert ds.name == "digits"
    assert ds.input_shape == (1, 8, 8)
    assert ds.num_classes == 10
    assert ds.x_train.shape == (1437, 1, 8, 8)
    assert ds.x_test.shape == (360, 1, 8, 8)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert abs(float(ds.x_train.mean())) < 1e-4
    assert abs(float(ds.x_train.std()) - 1.0) < 1e-3


def test_stratified() -> None:
    ds = load_digits(test_fraction=0.5)
    counts = torch.bincount(ds.y_test, minlength=10)
    # 1,797 digits, about 180 per class: a stratified half holds about 90 of each.
    assert int(counts.min()) >= 85 and int(counts.max()) <= 95


def test_deterministic_per_seed() -> None:
    a, b, c = load_digits(seed=3), load_digits(seed=3), load_digits(seed=4)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.y_train, c.y_train)


def test_leaves_global_rngs_alone() -> None:
    np_state = np.random.get_state()[1].copy()
    torch_state = torch.get_rng_state()
    load_digits(seed=7)
    assert np.array_equal(np.random.get_state()[1], np_state)
    assert torch.equal(torch.get_rng_state(), torch_state)


def test_bad_fraction() -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits(test_fraction=1.0)
