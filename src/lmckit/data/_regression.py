"""`RegressionData`: real-valued targets, for training and evaluating with ``lmckit.training.mse``.

:class:`lmckit.data.Dataset` holds class labels (int64); a regression problem has
float targets instead. Training (:func:`lmckit.training.fit`) and evaluation read either
through the same members (``x_train``, ``y_train``, ``split``...).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmckit.data._splits import Splits

__all__ = ["RegressionData"]


@dataclass(frozen=True, eq=False)
class RegressionData(Splits):
    """Inputs and real-valued targets held in memory.

    Attributes:
        name: short name, e.g. ``"teacher"``.
        x_train: inputs ``(N_train, *input_shape)``.
        y_train: float targets ``(N_train, *target_shape)``; the model's outputs must have
            the same shape per example.
        x_test, y_test: the held-out split, shaped likewise.
        x_val, y_val: optional validation split (early stopping), given together;
            keyword-only.
    """

    def __post_init__(self) -> None:
        self.check_pairs("regression data")
        for split in self.splits:
            x, y = self.split(split)
            if not y.is_floating_point():
                raise ValueError(
                    f"regression data {self.name!r}: y_{split} must be floating point, "
                    f"got {y.dtype}"
                )
            if x.dim() < 1 or y.dim() < 1 or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"regression data {self.name!r}: x_{split} {tuple(x.shape)} and y_{split} "
                    f"{tuple(y.shape)} must have the same number of samples"
                )
            if x.shape[1:] != self.x_train.shape[1:] or y.shape[1:] != self.y_train.shape[1:]:
                raise ValueError(
                    f"regression data {self.name!r}: {split} and train samples differ in shape"
                )

    def __repr__(self) -> str:
        return (
            f"RegressionData(name={self.name!r}, input_shape={self.input_shape}, "
            f"n_train={self.x_train.shape[0]}, n_test={self.x_test.shape[0]})"
        )
