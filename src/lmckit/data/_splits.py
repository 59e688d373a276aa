"""What every in-memory dataset shares: named train / optional val / test splits."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

__all__ = ["Splits"]

_SPLITS = ("train", "val", "test")


@dataclass(frozen=True, eq=False)
class Splits:
    """Members of a dataset held as ``x_{split}``, ``y_{split}`` tensors (the base of
    :class:`lmckit.data.Dataset` and :class:`lmckit.data.RegressionData`, which check
    their dtypes and shapes).

    The validation split is optional and keyword-only (so subclasses can add required
    fields after the test split): ``x_val`` and ``y_val`` are both ``None`` or both
    tensors (:meth:`check_pairs`).
    """

    # eq=False: the generated __eq__ would compare tensors, whose truth value is ambiguous.

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    x_val: Tensor | None = field(default=None, kw_only=True)
    y_val: Tensor | None = field(default=None, kw_only=True)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input, e.g. ``(1, 28, 28)`` or ``(32,)``."""
        return tuple(self.x_train.shape[1:])

    @property
    def has_val(self) -> bool:
        """Whether the dataset has a validation split."""
        return self.x_val is not None

    @property
    def splits(self) -> tuple[str, ...]:
        """Names of the splits present: ``train``, ``val`` if any, ``test``."""
        return _SPLITS if self.has_val else ("train", "test")

    def split(self, which: str) -> tuple[Tensor, Tensor]:
        """``(x, y)`` of the ``"train"``, ``"val"`` (where present) or ``"test"`` split."""
        if which == "train":
            return self.x_train, self.y_train
        if which == "test":
            return self.x_test, self.y_test
        if which == "val" and self.x_val is not None and self.y_val is not None:
            return self.x_val, self.y_val
        missing = " (this dataset has no validation split)" if which == "val" else ""
        raise ValueError(
            f"unknown split {which!r}: expected one of {', '.join(self.splits)}{missing}"
        )

    def check_pairs(self, kind: str) -> None:
        """``ValueError`` unless ``x_val`` and ``y_val`` are given together."""
        if (self.x_val is None) != (self.y_val is None):
            raise ValueError(f"{kind} {self.name!r}: give both x_val and y_val, or neither")
