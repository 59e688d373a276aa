"""`Dataset`: a labelled train/test pair of tensors, and mini-batch iteration over it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Dataset", "batches"]

_SPLITS = ("train", "test")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification dataset held in memory.

    Attributes:
        name: short name of the source, e.g. ``"mnist"``.
        x_train: inputs, float32 ``(N_train, *input_shape)``; images are ``(C, H, W)``.
        y_train: class labels, int64 ``(N_train,)`` with values in ``[0, num_classes)``.
        x_test: inputs, float32 ``(N_test, *input_shape)``.
        y_test: class labels, int64 ``(N_test,)``.
        num_classes: number of classes.
    """

    # eq=False: the generated __eq__ would compare tensors, whose truth value is ambiguous.

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int

    def __post_init__(self) -> None:
        # Checked once here so that every consumer can rely on dtypes and shapes.
        if self.num_classes < 1:
            raise ValueError(
                f"dataset {self.name!r}: num_classes must be >= 1, got {self.num_classes}"
            )
        for split in _SPLITS:
            x, y = self.split(split)
            if x.dtype != torch.float32:
                raise ValueError(f"dataset {self.name!r}: x_{split} must be float32, got {x.dtype}")
            if y.dtype != torch.int64 or y.dim() != 1:
                raise ValueError(
                    f"dataset {self.name!r}: y_{split} must be a 1-D int64 tensor, "
                    f"got {y.dtype} of shape {tuple(y.shape)}"
                )
            if x.dim() < 2 or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"dataset {self.name!r}: x_{split} {tuple(x.shape)} and y_{split} "
                    f"{tuple(y.shape)} must have the same number of samples"
                )
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise ValueError(
                    f"dataset {self.name!r}: y_{split} has labels outside [0, {self.num_classes})"
                )
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise ValueError(
                f"dataset {self.name!r}: train inputs {tuple(self.x_train.shape[1:])} and test "
                f"inputs {tuple(self.x_test.shape[1:])} differ in shape"
            )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input, e.g. ``(1, 28, 28)`` or ``(32,)``."""
        return tuple(self.x_train.shape[1:])

    def split(self, which: str) -> tuple[Tensor, Tensor]:
        """``(x, y)`` of the ``"train"`` or ``"test"`` split."""
        if which == "train":
            return self.x_train, self.y_train
        if which == "test":
            return self.x_test, self.y_test
        raise ValueError(f"unknown split {which!r}: expected one of {', '.join(_SPLITS)}")

    def __repr__(self) -> str:
        # The default repr would print every tensor element.
        return (
            f"Dataset(name={self.name!r}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes}, n_train={self.x_train.shape[0]}, "
            f"n_test={self.x_test.shape[0]})"
        )


def batches(
    x: Tensor,
    y: Tensor,
    batch_size: int,
    *,
    shuffle: bool = False,
    generator: torch.Generator | None = None,
    limit: int | None = None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Iterate over ``(x[i:i+batch_size], y[i:i+batch_size])`` mini-batches.

    The last batch may be smaller. Arguments are checked when this is called, not when
    iteration starts.

    Args:
        x: inputs ``(N, ...)``.
        y: targets ``(N, ...)``.
        batch_size: samples per batch.
        shuffle: visit the samples in a random order drawn from ``generator``.
        generator: CPU random source, required with ``shuffle`` (the global RNG is never used).
        limit: maximum number of batches to yield; ``None`` for all.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} samples but y has {y.shape[0]}")
    if shuffle and generator is None:
        raise ValueError(
            "shuffle=True needs an explicit torch.Generator (the global RNG is not used)"
        )
    order = torch.randperm(x.shape[0], generator=generator) if shuffle else None
    return _iterate(x, y, batch_size, order, limit)


def _iterate(
    x: Tensor, y: Tensor, batch_size: int, order: Tensor | None, limit: int | None
) -> Iterator[tuple[Tensor, Tensor]]:
    n = x.shape[0]
    starts = range(0, n, batch_size)
    if limit is not None:
        starts = starts[:limit]
    if order is not None:
        order = order.to(x.device)
    for start in starts:
        if order is None:
            yield x[start : start + batch_size], y[start : start + batch_size]
        else:
            idx = order[start : start + batch_size]
            yield x[idx], y[idx.to(y.device)]
