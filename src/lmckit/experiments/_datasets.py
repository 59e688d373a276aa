"""The data the experiments read from ``ctx.data_root``: MNIST subsets and character text."""

from __future__ import annotations

from pathlib import Path

import torch

from lmckit.data import Dataset, load_mnist
from lmckit.experiments._registry import ExperimentContext

__all__ = ["char_dataset", "mnist_subset"]


def mnist_subset(
    ctx: ExperimentContext, train_size: int | None = None, test_size: int | None = None
) -> Dataset:
    """MNIST from ``ctx.data("mnist")`` (:func:`lmckit.data.load_mnist`): the first
    ``train_size`` training and the first ``test_size`` test images (``None``: all)."""
    full = load_mnist(ctx.data("mnist"))
    return Dataset(
        full.name,
        full.x_train[:train_size],
        full.y_train[:train_size],
        full.x_test[:test_size],
        full.y_test[:test_size],
        full.num_classes,
    )


def char_dataset(
    path: str | Path, *, chars: int, block: int, test_fraction: float = 0.1
) -> Dataset:
    """Character-level language modelling on the first ``chars`` characters of a text.

    The vocabulary is the sorted set of characters in that prefix. The text is cut
    into contiguous blocks of ``block + 1`` characters (inputs: the first ``block``,
    targets: the next character at each position); the last ``test_fraction`` of the
    blocks test.
    """
    text = Path(path).read_text(encoding="utf-8")[:chars]
    vocab = sorted(set(text))
    if len(text) < 4 * (block + 1):
        raise ValueError(f"{chars} characters do not make enough blocks of {block}")
    ids = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    n_blocks = len(ids) // (block + 1)
    blocks = ids[: n_blocks * (block + 1)].reshape(n_blocks, block + 1)
    n_test = max(1, int(test_fraction * n_blocks))
    x, y = blocks[:, :-1], blocks[:, 1:]
    return Dataset(
        "chars", x[:-n_test], y[:-n_test], x[-n_test:], y[-n_test:], num_classes=len(vocab)
    )
