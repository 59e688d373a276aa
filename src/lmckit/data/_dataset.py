"""`Dataset`: labelled train/test (and optional validation) tensors, and mini-batches over them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from lmckit.data._splits import Splits

__all__ = ["Dataset", "batches"]


@dataclass(frozen=True, eq=False)
class Dataset(Splits):
    """A classification or language-modelling dataset held in memory.

    Classification: float32 inputs, one int64 label per example. Language modelling:
    int64 token ids ``(N, T)`` as inputs and the next tokens ``(N, T)`` as targets, with
    ``num_classes`` the vocabulary size.

    Attributes:
        name: short name of the source, e.g. ``"mnist"``.
        x_train: inputs ``(N_train, *input_shape)``: float32 features (images are
            ``(C, H, W)``) or int64 token ids ``(N_train, T)``.
        y_train: int64 targets with values in ``[0, num_classes)``: class labels
            ``(N_train,)``, or next-token ids of the same shape as the token inputs.
        x_test: inputs ``(N_test, *input_shape)``.
        y_test: targets of the test inputs.
        num_classes: number of classes (vocabulary size for language models).
        x_val: optional validation inputs ``(N_val, *input_shape)`` (early stopping);
            keyword-only.
        y_val: validation targets; given exactly when ``x_val`` is.
    """

    num_classes: int

    def __post_init__(self) -> None:
        # Checked once here so that every consumer can rely on dtypes and shapes.
        if self.num_classes < 1:
            raise ValueError(
                f"dataset {self.name!r}: num_classes must be >= 1, got {self.num_classes}"
            )
        self.check_pairs("dataset")
        for split in self.splits:
            x, y = self.split(split)
            self._check_split(split, x, y)
        for split in self.splits[1:]:
            x = self.split(split)[0]
            if x.shape[1:] != self.x_train.shape[1:] or x.dtype != self.x_train.dtype:
                raise ValueError(
                    f"dataset {self.name!r}: train inputs {tuple(self.x_train.shape[1:])} "
                    f"({self.x_train.dtype}) and {split} inputs {tuple(x.shape[1:])} ({x.dtype}) "
                    "differ in shape or dtype"
                )

    def _check_split(self, split: str, x: Tensor, y: Tensor) -> None:
        if x.dtype not in (torch.float32, torch.int64):
            raise ValueError(
                f"dataset {self.name!r}: x_{split} must be float32 (features) or int64 "
                f"(token ids), got {x.dtype}"
            )
        # Token inputs predict one target per token; features predict one per example.
        tokens = x.dtype == torch.int64
        if y.dtype != torch.int64 or (y.shape != x.shape if tokens else y.dim() != 1):
            expected = f"of shape {tuple(x.shape)} like the tokens" if tokens else "1-D"
            raise ValueError(
                f"dataset {self.name!r}: y_{split} must be an int64 tensor {expected}, "
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
        if tokens and x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.num_classes):
            raise ValueError(
                f"dataset {self.name!r}: x_{split} has token ids outside [0, {self.num_classes})"
            )

    @property
    def is_language(self) -> bool:
        """Whether inputs are token ids ``(N, T)`` with next-token targets ``(N, T)``."""
        return self.x_train.dtype == torch.int64

    def __repr__(self) -> str:
        # The default repr would print every tensor element.
        val = f", n_val={self.x_val.shape[0]}" if self.x_val is not None else ""
        return (
            f"Dataset(name={self.name!r}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes}, n_train={self.x_train.shape[0]}{val}, "
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
