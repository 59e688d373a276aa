"""CIFAR-10 loader and its restricted unpickler."""

from __future__ import annotations

import os
import pickle
import struct
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from lmckit.data import load_cifar10

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _batch(n: int, offset: int) -> dict[bytes, object]:
    """``n`` images; image i has red = i, green = 100 + i, blue = 200 + i everywhere."""
    index = np.arange(offset, offset + n)
    planes = np.stack([index, 100 + index, 200 + index], axis=1) % 256  # (n, 3)
    data = np.repeat(planes, 1024, axis=1).astype(np.uint8)  # (n, 3072): R plane, G, B
    return {
        b"batch_label": b"fixture",
        b"labels": [int(i % 10) for i in index],
        b"data": data,
        b"filenames": [f"img{i}.png".encode() for i in index],
    }


def _write(path: Path, obj: object, protocol: int = pickle.DEFAULT_PROTOCOL) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=protocol))


def _py2_batch_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """A batch pickled as Python 2 and NumPy 1 wrote the original files (protocol 2)."""

    def text(b: bytes) -> bytes:  # SHORT_BINSTRING / BINSTRING: a Python 2 str
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b

    def i32(i: int) -> bytes:
        return b"J" + struct.pack("<i", i)

    # _reconstruct(ndarray, (0,), "b"), then BUILD with the state
    # (1, shape, dtype("u1") with its own state, fortran=False, raw bytes).
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + text(b"b") + b"\x87R"
        + b"(K\x01" + i32(data.shape[0]) + i32(data.shape[1]) + b"\x86"
        + b"cnumpy\ndtype\n" + text(b"u1") + b"K\x00K\x01\x87R"
        + b"(K\x03" + text(b"|") + b"NNN" + i32(-1) + i32(-1) + b"K\x00tb"
        + b"\x89" + text(data.tobytes()) + b"tb"
    )  # fmt: skip
    label_ops = b"".join(b"K" + bytes([label]) for label in labels)
    return b"\x80\x02}(" + text(b"data") + array + text(b"labels") + b"](" + label_ops + b"eu."


def _expected(index: torch.Tensor) -> torch.Tensor:
    planes = torch.stack([index, 100 + index, 200 + index], dim=1) % 256  # (n, 3)
    return (planes.float() / 255 - torch.tensor(MEAN)) / torch.tensor(STD)


def test_load_subset_of_batches(tmp_path: Path) -> None:
    _write(tmp_path / "data_batch_3", _batch(4, offset=10), protocol=2)
    _write(tmp_path / "data_batch_1", _batch(5, offset=0))
    (tmp_path / "data_batch_2.bak").write_bytes(b"not a batch")  # ignored: not data_batch_N
    _write(tmp_path / "test_batch", _batch(6, offset=50), protocol=5)
    ds = load_cifar10(tmp_path)
    assert ds.name == "cifar10" and ds.num_classes == 10
    assert ds.input_shape == (3, 32, 32)
    assert ds.x_train.shape == (9, 3, 32, 32) and ds.x_test.shape == (6, 3, 32, 32)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    # Batches in numeric order, each channel plane in its place, normalised per channel.
    train_index = torch.cat([torch.arange(0, 5), torch.arange(10, 14)])
    assert torch.equal(ds.y_train, train_index % 10)
    assert torch.allclose(ds.x_train[:, :, 7, 19], _expected(train_index), atol=1e-5)
    assert torch.allclose(ds.x_test.amin(dim=(2, 3)), ds.x_test.amax(dim=(2, 3)))
    assert torch.allclose(ds.x_test[:, :, 0, 0], _expected(torch.arange(50, 56)), atol=1e-5)


def test_python2_numpy1_batch(tmp_path: Path) -> None:
    batch = _batch(3, offset=0)
    (tmp_path / "data_batch_1").write_bytes(
        _py2_batch_pickle(batch[b"data"], batch[b"labels"])  # type: ignore[arg-type]
    )
    _write(tmp_path / "test_batch", _batch(2, offset=3))
    ds = load_cifar10(tmp_path)
    assert torch.equal(ds.y_train, torch.tensor([0, 1, 2]))
    assert torch.allclose(ds.x_train[:, :, 31, 31], _expected(torch.arange(3)), atol=1e-5)


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_malicious_pickle_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    _write(tmp_path / "data_batch_1", _batch(2, offset=0))
    _write(tmp_path / "test_batch", {b"data": _Exploit(marker), b"labels": [0]})
    with pytest.raises(
        ValueError, match="refusing to unpickle .*system.*not a plain CIFAR-10 batch"
    ):
        load_cifar10(tmp_path)
    assert not marker.exists()


def test_other_globals_refused(tmp_path: Path) -> None:
    _write(tmp_path / "test_batch", _batch(2, offset=0))
    # An OrderedDict is harmless data, but its pickle names a class: not a plain batch.
    _write(tmp_path / "data_batch_1", OrderedDict(data=b"", labels=[]))
    with pytest.raises(ValueError, match="refusing to unpickle collections.OrderedDict"):
        load_cifar10(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (pickle.dumps([1, 2]), "expected a dict"),
        (pickle.dumps({b"labels": [0]}), "no 'data' entry"),
        (pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}), "3072"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "labels for"),
        (pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [10]}), "0..9"),
        (pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0]})[:-30], "corrupt"),
    ],
)
def test_corrupt_batches(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "data_batch_1").write_bytes(content)
    _write(tmp_path / "test_batch", _batch(2, offset=0))
    with pytest.raises(ValueError, match=f"data_batch_1.*{message}"):
        load_cifar10(tmp_path)


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data_batch_1 .. data_batch_5.*test_batch"):
        load_cifar10(tmp_path / "nowhere")
    _write(tmp_path / "test_batch", _batch(2, offset=0))
    with pytest.raises(FileNotFoundError, match="at least one"):
        load_cifar10(tmp_path)
