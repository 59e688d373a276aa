"""IDX reader and MNIST loader, on fixtures written here and on the shared MNIST test set."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from lmckit.data import load_mnist
from lmckit.data._mnist import read_idx

SHARED_MNIST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist"

_CODES = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D}


def _idx_bytes(array: np.ndarray) -> bytes:
    """Encode ``array`` (uint8, or int32/float32 stored big-endian) as IDX."""
    big = array.astype(array.dtype.newbyteorder(">")) if array.dtype.itemsize > 1 else array
    header = bytes([0, 0, _CODES[big.dtype], array.ndim]) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    return header + big.tobytes()


def _write(path: Path, array: np.ndarray, *, gz: bool) -> Path:
    data = _idx_bytes(array)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _write_pair(root: Path, prefix: str, images: np.ndarray, labels: np.ndarray, gz: bool) -> None:
    suffix = ".gz" if gz else ""
    _write(root / f"{prefix}-images-idx3-ubyte{suffix}", images, gz=gz)
    _write(root / f"{prefix}-labels-idx1-ubyte{suffix}", labels, gz=gz)


def _digits(n: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images whose first pixel and label encode their index, to check order."""
    index = np.arange(offset, offset + n)
    images = np.zeros((n, 28, 28), dtype=np.uint8)
    images[:, 0, 0] = index % 256
    return images, (index % 10).astype(np.uint8)


# read_idx


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
        np.arange(-50, 190, 10, dtype=np.int32).reshape(2, 3, 4),
        np.linspace(-1.5, 2.5, 24, dtype=np.float32).reshape(2, 3, 4),
    ],
    ids=["uint8", "int32", "float32"],
)
def test_read_idx_round_trip(tmp_path: Path, gz: bool, array: np.ndarray) -> None:
    got = read_idx(_write(tmp_path / "a.idx", array, gz=gz))
    assert got.shape == (2, 3, 4)
    assert got.dtype == array.dtype  # native byte order
    assert np.array_equal(got, array)
    got[0, 0, 0] = 1  # writable copy, not a view of the file's bytes


def test_read_idx_detects_gzip_by_magic_not_suffix(tmp_path: Path) -> None:
    array = np.arange(5, dtype=np.uint8)
    assert np.array_equal(read_idx(_write(tmp_path / "plain-name", array, gz=True)), array)
    assert np.array_equal(read_idx(_write(tmp_path / "fake.gz", array, gz=False)), array)


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_truncated_names_file(tmp_path: Path, gz: bool) -> None:
    data = _idx_bytes(np.zeros((4, 28, 28), dtype=np.uint8))[:-10]
    path = tmp_path / "short-file"
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(ValueError, match="short-file.*truncated"):
        read_idx(path)


def test_read_idx_truncated_gzip_stream(tmp_path: Path) -> None:
    path = tmp_path / "cut.gz"
    path.write_bytes(gzip.compress(_idx_bytes(np.zeros((4, 28, 28), np.uint8)))[:-20])
    with pytest.raises(ValueError, match="cut.gz.*gzip"):
        read_idx(path)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x00\x00", "no complete header"),
        (b"\x01\x00\x08\x01" + struct.pack(">I", 1) + b"\x00", "magic number"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x00", "dtype code 0x07"),
        (b"\x00\x00\x08\x00", "0 dimensions"),
        (b"\x00\x00\x08\x03" + struct.pack(">I", 1), "truncated IDX header"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 2) + b"\x00\x00\x00", "trailing bytes"),
    ],
)
def test_read_idx_corrupt(tmp_path: Path, raw: bytes, message: str) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=f"bad.idx.*{message}"):
        read_idx(path)


# load_mnist


@pytest.fixture(scope="module")
def t10k_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A full-size t10k set is cheap when almost all zeros (7.8 MB, plain).
    root = tmp_path_factory.mktemp("t10k_only")
    _write_pair(root, "t10k", *_digits(10_000), gz=False)
    return root


def test_t10k_only_uses_8000_2000(t10k_only: Path) -> None:
    ds = load_mnist(t10k_only)
    assert ds.name == "mnist" and ds.num_classes == 10
    assert ds.x_train.shape == (8000, 1, 28, 28) and ds.x_test.shape == (2000, 1, 28, 28)
    assert torch.equal(ds.y_train, torch.arange(8000) % 10)
    assert torch.equal(ds.y_test, torch.arange(8000, 10_000) % 10)
    # Order kept and normalisation (pixel / 255 - 0.1307) / 0.3081 applied.
    first_pixel = ds.x_test[:, 0, 0, 0] * 0.3081 + 0.1307
    expected = (torch.arange(8000, 10_000) % 256).float() / 255
    assert torch.allclose(first_pixel, expected, atol=1e-5)
    assert torch.allclose(ds.x_train[:, 0, 1:], torch.tensor(-0.1307 / 0.3081))


def test_t10k_only_train_size_keeps_last_2000_for_test(t10k_only: Path) -> None:
    ds = load_mnist(t10k_only, train_size=500)
    assert len(ds.y_train) == 500 and len(ds.y_test) == 2000
    assert torch.equal(ds.y_test, torch.arange(8000, 10_000) % 10)
    ds = load_mnist(t10k_only, train_size=9000)
    assert len(ds.y_train) == 9000 and len(ds.y_test) == 1000


def test_t10k_only_small_fixture(tmp_path: Path) -> None:
    _write_pair(tmp_path, "t10k", *_digits(50), gz=True)
    ds = load_mnist(tmp_path, train_size=40)
    assert len(ds.y_train) == 40 and len(ds.y_test) == 10
    assert torch.equal(ds.y_test, torch.arange(40, 50) % 10)
    with pytest.raises(ValueError, match="leaves none to test"):
        load_mnist(tmp_path, train_size=50)
    with pytest.raises(ValueError, match="leaves none to test"):
        load_mnist(tmp_path)  # the default 8,000 exceeds the 50 images
    with pytest.raises(ValueError, match="train_size"):
        load_mnist(tmp_path, train_size=0)


def test_train_and_test_files(tmp_path: Path) -> None:
    _write_pair(tmp_path, "train", *_digits(30), gz=True)
    _write_pair(tmp_path, "t10k", *_digits(12, offset=100), gz=False)
    ds = load_mnist(tmp_path)
    assert len(ds.y_train) == 30 and len(ds.y_test) == 12
    assert torch.equal(ds.y_test, torch.arange(100, 112) % 10)
    assert len(load_mnist(tmp_path, train_size=7).y_train) == 7


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte.*t10k-labels-idx1-ubyte"):
        load_mnist(tmp_path)
    _write_pair(tmp_path, "t10k", *_digits(12), gz=False)
    _write(tmp_path / "train-images-idx3-ubyte", _digits(3)[0], gz=False)
    with pytest.raises(FileNotFoundError, match="train-labels-idx1-ubyte"):
        load_mnist(tmp_path)


def test_mismatched_labels(tmp_path: Path) -> None:
    images, labels = _digits(12)
    _write_pair(tmp_path, "t10k", images, labels[:11], gz=False)
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.*12 labels"):
        load_mnist(tmp_path, train_size=4)


@pytest.mark.skipif(not SHARED_MNIST.is_dir(), reason="shared MNIST test set not present")
def test_shared_mnist() -> None:
    ds = load_mnist(SHARED_MNIST)
    assert ds.x_train.shape == (8000, 1, 28, 28) and ds.x_test.shape == (2000, 1, 28, 28)
    for y in (ds.y_train, ds.y_test):
        assert int(y.min()) == 0 and int(y.max()) == 9
        assert torch.bincount(y, minlength=10).min() > 100
    # The usual MNIST constants standardise the real images to about mean 0, std 1.
    assert abs(float(ds.x_train.mean())) < 0.05
    assert abs(float(ds.x_train.std()) - 1.0) < 0.05
