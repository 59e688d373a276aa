"""Weight matching's ``start="best"``: run both starts, keep the one whose midpoint fits data.

The anchored start (:mod:`lmckit.aligners._weight.anchored`) lowers barriers on MLPs, ResNets and
GPT-2 permutations, and raises them on some pairs (ViTs with projected heads, a small
GPT-2 under permutations), where it also reaches the *higher* weight-matching objective:
the data-free objective cannot tell which start is better there
(``docs/experiments/reference_comparison.md``). A little training data can: with
``start="best"`` weight matching runs from both starts and keeps the transform whose
midpoint ``(theta_a + T(theta_b)) / 2`` has the lower loss on a fixed sample of the
training split (all of a small one; noisy small samples picked the wrong start on a
ViT pair). The choice reads only training data, never the split a barrier is measured
on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.aligners._result import AlignmentResult
from lmckit.data import Dataset, batches
from lmckit.measure._evaluate import evaluate
from lmckit.merging._merge import reset_batchnorm
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params

__all__ = ["STARTS", "StartChoice", "best_start", "midpoint_loss"]

#: The starts ``start="best"`` chooses between.
STARTS = ("anchored", "identity")


@dataclass(frozen=True)
class StartChoice(AlignmentResult):
    """Weight matching from the start whose midpoint had the lower training loss.

    Attributes:
        start: the start kept (``"anchored"`` or ``"identity"``).
        midpoint_losses: per start, the mean loss of the midpoint on the sample.
    """

    start: str = ""
    midpoint_losses: dict[str, float] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        chosen = {"chosen": self.start, "midpoint_losses": dict(self.midpoint_losses)}
        return {**super().metadata(), "start": chosen}

    def summary(self) -> str:
        losses = ", ".join(f"{s} {v:.4g}" for s, v in self.midpoint_losses.items())
        return f"{super().summary()}; start {self.start} (midpoint training loss: {losses})"


def midpoint_loss(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    data: Dataset,
    *,
    targets: int = 32768,
    seed: int = 0,
    batch_size: int = 64,
) -> float:
    """Mean loss of ``(params_a + params_b) / 2`` on a sample of the training split.

    The sample holds whole examples with at least ``targets`` targets in all (labels;
    tokens for a language model's blocks), or the whole split if it has fewer; it is
    the same for a given ``seed``, so that two candidates are compared on the same data.
    BatchNorm statistics of the midpoint are recomputed on the sample first.
    """
    x, y = data.split("train")
    per_example = max(1, y[0].numel())
    examples = min(-(-targets // per_example), x.shape[0])
    generator = torch.Generator().manual_seed(seed)
    pick = torch.randperm(x.shape[0], generator=generator)[:examples]
    mid = interpolate(params_a, params_b, 0.5)
    # interpolated BatchNorm statistics are wrong (Jordan et al., 2023): recompute them on
    # the sample, as barriers with BatchNorm are measured
    mid = reset_batchnorm(model, mid, (xb for xb, _ in batches(x[pick], y[pick], batch_size)))
    return evaluate(model, mid, batches(x[pick], y[pick], batch_size)).loss


def best_start(
    run: Callable[[str], AlignmentResult],
    params_a: Params,
    params_b: Params,
    *,
    model: nn.Module | None,
    data: Dataset | None,
    targets: int,
    seed: int = 0,
) -> StartChoice:
    """``run(start)`` for each of :data:`STARTS`; the result with the lower midpoint loss.

    Args:
        run: weight matching from the given start.
        params_a, params_b: the models ``run`` aligns (B is moved by each result).
        model: the architecture of ``params_a`` (the midpoint has A's shapes).
        data: a :class:`~lmckit.data.Dataset`; its training split is sampled.
        targets: training targets in the sample (:func:`midpoint_loss`).
        seed: seed of the sample.

    Raises:
        ValueError: ``model`` or ``data`` is missing (before any matching runs).
    """
    if model is None or not isinstance(data, Dataset):
        raise ValueError(
            "weight matching with start='best' compares the starts' midpoints on training "
            "data: give model= and data= (a Dataset)"
        )
    begin = time.perf_counter()
    results = {start: run(start) for start in STARTS}
    losses = {
        start: midpoint_loss(
            model, params_a, result.apply(params_b), data, targets=targets, seed=seed
        )
        for start, result in results.items()
    }
    # a NaN loss never wins (min would keep whichever came first)
    chosen = min(STARTS, key=lambda s: (losses[s] != losses[s], losses[s]))
    kept = {f.name: getattr(results[chosen], f.name) for f in fields(AlignmentResult)}
    kept["seconds"] = time.perf_counter() - begin  # both runs and both evaluations
    return StartChoice(**kept, start=chosen, midpoint_losses=losses)
