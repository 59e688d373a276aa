"""MNIST from IDX files, and a validating reader for the IDX format.

IDX (LeCun's format): two zero bytes, a dtype code, the number of dimensions ``d``, then
``d`` big-endian uint32 sizes and the row-major, big-endian payload. The files are often
gzipped; :func:`read_idx` tells by the gzip magic bytes, whatever the file is called.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import torch

from lmckit.data._dataset import Dataset
from lmckit.formats._bounded import FileLimitError, read_maybe_gzip, regular_file

__all__ = ["load_mnist", "read_idx"]

_GZIP_MAGIC = b"\x1f\x8b"
#: Largest IDX file read (after decompression); MNIST's largest is 47 MB.
MAX_IDX_BYTES = 1 << 30

# IDX dtype codes; multi-byte types are stored big-endian.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

# Usual MNIST normalisation: mean and std of the training pixels after /255.
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

# Convention for a directory holding only the 10,000 t10k images (see shared/data/README.md).
_T10K_ONLY_TRAIN = 8000
_T10K_ONLY_TEST = 2000

_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def _declared_size(path: Path) -> int:
    """Bytes the IDX header at the start of ``path`` declares (header included), or 0.

    Only the first kilobyte is read (and gunzipped), so a file that expands to
    gigabytes is sized before it is decompressed; 0 when the header is unreadable
    (:func:`read_idx` then reports what is wrong with it).
    """
    with open(path, "rb") as fh:
        head = fh.read(1024)
    if head[:2] == _GZIP_MAGIC:
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, 4 + 4 * 255)
        except zlib.error:
            return 0
    if len(head) < 4 or head[0] or head[1] or head[2] not in _IDX_DTYPES:
        return 0
    ndim = head[3]
    if len(head) < 4 + 4 * ndim:
        return 0
    shape = np.frombuffer(head, dtype=">u4", count=ndim, offset=4)
    return 4 + 4 * ndim + _IDX_DTYPES[head[2]].itemsize * int(np.prod(shape, dtype=object))


def read_idx(path: str | os.PathLike[str], *, max_bytes: int = MAX_IDX_BYTES) -> np.ndarray:
    """Read an IDX file, gzipped or not, into a native-endian array of its shape.

    At most ``max_bytes`` are read or decompressed: the header's declared size is
    checked before the payload is touched, and decompression stops one byte past it.

    Raises:
        ValueError: naming the file when it is not a regular file, too large, truncated,
            has trailing bytes, a bad magic number or an unknown dtype code, or is a
            corrupt gzip stream.
    """
    path = Path(path)
    regular_file(path, what="IDX file")
    declared = _declared_size(path)
    if declared > max_bytes:
        raise ValueError(
            f"{path}: the IDX header declares {declared:,} bytes, more than the "
            f"{max_bytes:,} allowed"
        )
    # one byte past the declared size is enough to report trailing bytes
    limit = declared + 1 if declared else max_bytes
    try:
        raw = read_maybe_gzip(path, max_bytes=max_bytes, max_output=limit, what="IDX file")
    except FileLimitError:
        if not declared:
            raise
        raise ValueError(
            f"{path}: IDX file has trailing bytes beyond the {declared:,} its header declares"
        ) from None
    if len(raw) < 4:
        raise ValueError(f"{path}: truncated IDX file ({len(raw)} bytes, no complete header)")
    if raw[0] != 0 or raw[1] != 0:
        raise ValueError(
            f"{path}: not an IDX file (magic number {raw[:4].hex()} should start 0000)"
        )
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX dtype code 0x{code:02x}")
    if ndim == 0:
        raise ValueError(f"{path}: IDX header declares 0 dimensions")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise ValueError(f"{path}: truncated IDX header ({ndim} dimensions declared)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    # Python ints: the product cannot overflow, even for a corrupt header.
    expected = dtype.itemsize * int(np.prod(shape, dtype=object))
    actual = len(raw) - header_len
    if actual != expected:
        what = "truncated" if actual < expected else "has trailing bytes"
        raise ValueError(
            f"{path}: IDX file {what}: shape {shape} of {dtype.name} needs {expected} "
            f"payload bytes, found {actual}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(shape)
    # Copy into native byte order: frombuffer's result is read-only and may be big-endian.
    return data.astype(dtype.newbyteorder("="), copy=True)


def _find_pair(root: Path, images: str, labels: str) -> tuple[Path | None, Path | None]:
    """The images and labels files of one split, both in one form where they can be.

    Each file may be plain or ``.gz``; when a folder holds both forms (a decompressed
    copy beside the download, perhaps of another version), images and labels are taken
    from the same form: plain if both are there plainly, else gzipped if both are;
    only when neither form is complete are they mixed.
    """
    for suffix in ("", ".gz"):
        pair = (root / f"{images}{suffix}", root / f"{labels}{suffix}")
        if pair[0].is_file() and pair[1].is_file():
            return pair

    def one(stem: str) -> Path | None:
        return next((c for c in (root / stem, root / f"{stem}.gz") if c.is_file()), None)

    return one(images), one(labels)


def _read_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(
            f"{images_path}: expected uint8 images of shape (N, 28, 28), "
            f"got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{labels_path}: expected {images.shape[0]} labels to match {images_path.name}, "
            f"got shape {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{labels_path}: labels outside 0..9")
    return images, labels


def _to_tensors(images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(images).to(torch.float32).div_(255.0)
    x = x.sub_(MNIST_MEAN).div_(MNIST_STD).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


def load_mnist(path: str | os.PathLike[str], *, train_size: int | None = None) -> Dataset:
    """MNIST from a directory of IDX files, as ``(1, 28, 28)`` normalised images.

    Files looked for (each plain or ``.gz``): ``train-images-idx3-ubyte``,
    ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``;
    where both forms are present, the images and labels of a split come from the same
    form (plain first).
    With the train files, they are the training split (the first ``train_size`` images
    if given) and t10k is the test split. With only the t10k files, the first
    ``train_size`` (default 8,000) images train and the last 2,000 test; when fewer than
    2,000 images remain after the training ones, all of those test. Pixels are divided
    by 255, then normalised with mean 0.1307 and std 0.3081.

    Raises:
        FileNotFoundError: listing the files looked for, when the t10k pair or half of
            the train pair is missing.
        ValueError: on a corrupt file or a ``train_size`` that leaves no test images.
    """
    root = Path(path).expanduser()
    test_pair = _find_pair(root, _FILES["test_images"], _FILES["test_labels"])
    train_pair = _find_pair(root, _FILES["train_images"], _FILES["train_labels"])
    if test_pair[0] is None or test_pair[1] is None:
        looked_for = ", ".join(f"{stem}[.gz]" for stem in _FILES.values())
        raise FileNotFoundError(
            f"no MNIST IDX files in {root}: looked for {looked_for} "
            "(the t10k pair is required; the train pair is optional)"
        )
    if (train_pair[0] is None) != (train_pair[1] is None):
        missing = _FILES["train_labels"] if train_pair[1] is None else _FILES["train_images"]
        raise FileNotFoundError(
            f"{root} holds only half of the MNIST train pair: {missing}[.gz] is missing"
        )
    if train_size is not None and train_size < 1:
        raise ValueError(f"train_size must be >= 1, got {train_size}")
    test_images, test_labels = _read_pair(test_pair[0], test_pair[1])

    if train_pair[0] is not None and train_pair[1] is not None:
        train_images, train_labels = _read_pair(train_pair[0], train_pair[1])
        if train_size is not None:
            train_images, train_labels = train_images[:train_size], train_labels[:train_size]
    else:
        n = test_images.shape[0]
        n_train = _T10K_ONLY_TRAIN if train_size is None else train_size
        if n_train >= n:
            raise ValueError(
                f"{root} holds only the {n} t10k images: train_size={n_train} leaves none to test"
            )
        # The test split stays the last 2,000 images whatever train_size is, so that runs
        # with smaller training sets are scored on the same images.
        test_start = max(n_train, n - _T10K_ONLY_TEST)
        train_images, train_labels = test_images[:n_train], test_labels[:n_train]
        test_images, test_labels = test_images[test_start:], test_labels[test_start:]

    x_train, y_train = _to_tensors(train_images, train_labels)
    x_test, y_test = _to_tensors(test_images, test_labels)
    return Dataset("mnist", x_train, y_train, x_test, y_test, num_classes=10)
