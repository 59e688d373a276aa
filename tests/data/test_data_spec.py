"""`load_data` spec parsing."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import lmckit.data
import lmckit.data._source
from lmckit.data import load_data, make_gmm
from lmckit.data._source import DATA_SPEC_HELP


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_digits() -> None:
    a, b = load_data("digits", seed=1), load_data(" digits ", seed=2)
    assert a.name == "digits" and a.input_shape == (1, 8, 8)
    assert not torch.equal(a.y_train, b.y_train)


def test_gmm_default_matches_make_gmm() -> None:
    assert torch.equal(load_data("gmm", seed=5).x_train, make_gmm(seed=5).x_train)


def test_gmm_options() -> None:
    ds = load_data("gmm:dim=16, intrinsic=4,classes=3,n=40,noise=0.5,sep=2", seed=3)
    ref = make_gmm(
        dim=16, intrinsic_dim=4, classes=3, n_train=40, n_test=10, noise=0.5, separation=2, seed=3
    )
    assert ds.x_train.shape == (40, 16) and ds.x_test.shape == (10, 16)
    assert ds.num_classes == 3
    assert torch.equal(ds.x_test, ref.x_test)


def test_mnist_path_with_colon(tmp_path: Path) -> None:
    root = tmp_path / "a:b,c"
    root.mkdir()
    for prefix, n in (("train", 8), ("t10k", 4)):
        _write_idx(root / f"{prefix}-images-idx3-ubyte.gz", np.zeros((n, 28, 28)))
        _write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    ds = load_data(f"mnist:{root}")
    assert ds.name == "mnist" and len(ds.y_train) == 8 and len(ds.y_test) == 4


def test_cifar10(tmp_path: Path) -> None:
    for name, n in (("data_batch_1", 3), ("test_batch", 2)):
        batch = {b"data": np.zeros((n, 3072), np.uint8), b"labels": list(range(n))}
        (tmp_path / name).write_bytes(pickle.dumps(batch))
    ds = load_data(f"cifar10:{tmp_path}")
    assert ds.name == "cifar10" and ds.x_train.shape == (3, 3, 32, 32)


def test_missing_directory_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_data(f"mnist:{tmp_path / 'none'}")


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("imagenet", "unknown dataset 'imagenet'"),
        ("", "unknown dataset ''"),
        ("digits:x", "digits takes no options"),
        ("mnist", "mnist needs a directory"),
        ("cifar10: ", "cifar10 needs a directory"),
        ("gmm:", "is not KEY=VALUE"),
        ("gmm:dim", "'dim' is not KEY=VALUE"),
        ("gmm:dim=", "is not KEY=VALUE"),
        ("gmm:depth=3", "unknown gmm option 'depth'.*dim, intrinsic, classes, n, noise, sep"),
        ("gmm:dim=abc", "dim='abc' is not a valid int"),
        ("gmm:noise=lots", "noise='lots' is not a valid float"),
        ("gmm:dim=4,dim=5", "'dim' given twice"),
        ("gmm:dim=4,intrinsic=8", "intrinsic_dim <= dim"),
        ("gmm:n=3", r"n=3 must be >= 4"),
    ],
)
def test_bad_specs(spec: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as info:
        load_data(spec)
    assert "Valid forms: digits, mnist:PATH, cifar10:PATH, gmm, gmm:KEY=VALUE" in str(info.value)


def test_help_text() -> None:
    assert "\n" not in DATA_SPEC_HELP
    for form in ("'digits'", "'mnist:PATH'", "'cifar10:PATH'", "'gmm'", "'gmm:KEY=VALUE"):
        assert form in DATA_SPEC_HELP
    doc = lmckit.data._source.__doc__
    assert doc is not None and "gmm:KEY=VALUE" in doc and "mnist:PATH" in doc


def test_public_api() -> None:
    assert sorted(lmckit.data.__all__) == sorted(
        [
            "Dataset",
            "RegressionData",
            "batches",
            "load_cifar10",
            "load_data",
            "load_digits",
            "load_mnist",
            "make_gmm",
        ]
    )
    for name in lmckit.data.__all__:
        assert hasattr(lmckit.data, name)
