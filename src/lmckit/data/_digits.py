"""scikit-learn's 8x8 handwritten digits (1,797 images, bundled with scikit-learn)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits as _sklearn_digits
from sklearn.model_selection import train_test_split

from lmckit.data._dataset import Dataset

__all__ = ["load_digits"]

# sklearn's digits are counts of set pixels in 4x4 blocks of a 32x32 bitmap: 0..16.
_MAX_PIXEL = 16.0


def load_digits(*, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """The digits as ``(1, 8, 8)`` images, 10 classes, split stratified by class.

    Pixels are scaled to ``[0, 1]`` and then standardised with the mean and standard
    deviation of the training pixels (one scalar each: corner pixels are always 0, so a
    per-pixel std would divide by zero).

    Args:
        seed: seed of the train/test split; the same seed gives the same split.
        test_fraction: fraction of the images held out for testing, in ``(0, 1)``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    bunch = _sklearn_digits()
    images = np.asarray(bunch.images, dtype=np.float32) / _MAX_PIXEL
    labels = np.asarray(bunch.target, dtype=np.int64)
    # random_state is a private NumPy generator inside sklearn: the global RNG stays untouched.
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, random_state=seed, stratify=labels
    )
    mean = float(x_train.mean())
    std = float(x_train.std())

    def to_tensor(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy((x - mean) / std).to(torch.float32).unsqueeze(1)

    return Dataset(
        name="digits",
        x_train=to_tensor(x_train),
        y_train=torch.from_numpy(y_train),
        x_test=to_tensor(x_test),
        y_test=torch.from_numpy(y_test),
        num_classes=10,
    )
