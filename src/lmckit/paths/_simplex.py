"""The simplex spanned by ``K`` models: loss on a barycentric grid, multi-model barrier.

For models ``theta_1..theta_K`` and convex weights ``w`` (``w_k >= 0``,
``sum_k w_k = 1``) the point ``theta(w) = sum_k w_k theta_k`` runs through the
architecture's module with ``torch.func.functional_call``. The grid holds every
``w = c / r`` with non-negative integers ``c`` summing to the resolution ``r``
(``(r + 1)(r + 2) / 2`` points for ``K = 3``), vertices included. Barriers
generalise the linear path's (:mod:`lmckit.measure._evaluate`):

- loss:     ``max_w [ L(theta(w)) - sum_k w_k L_k ]``
- accuracy: ``max_w [ sum_k w_k A_k - A(theta(w)) ]``

with ``L_k, A_k`` measured at the vertices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn

from lmckit.measure._batched import Batching, point_sums
from lmckit.measure._record import JsonRecord
from lmckit.symmetry._average import weighted_average
from lmckit.symmetry._params import Params, check_compatible
from lmckit.training._task import CLASSIFICATION

__all__ = [
    "MAX_SIMPLEX_POINTS",
    "SimplexResult",
    "check_simplex_size",
    "evaluate_simplex",
    "simplex_grid",
    "simplex_size",
]

#: Most grid points a simplex may have: each is a full evaluation of the data.
MAX_SIMPLEX_POINTS = 100_000

Batches = Iterable[tuple[Tensor, Tensor]]
PointFn = Callable[[Params, tuple[float, ...]], Params]


def simplex_size(k: int, resolution: int) -> int:
    """Points of the grid over ``k`` models at ``resolution``: ``C(r + k - 1, k - 1)``."""
    return math.comb(resolution + k - 1, k - 1)


def check_simplex_size(k: int, resolution: int, *, max_points: int = MAX_SIMPLEX_POINTS) -> int:
    """Validate a grid before building it; return its number of points.

    Raises:
        ValueError: fewer than 2 models, a resolution below 2, or more than
            ``max_points`` points (naming the count).
    """
    if k < 2:
        raise ValueError(f"a simplex needs at least 2 models, got {k}")
    if resolution < 2:
        raise ValueError(
            f"resolution must be >= 2, got {resolution} (with 1 the grid holds only the "
            "models themselves and the barrier is 0 by definition)"
        )
    # Bound the resolution first: math.comb of a huge number is itself slow.
    if resolution > max_points:
        raise ValueError(
            f"resolution {resolution} gives more than {max_points:,} grid points over {k} "
            "models; choose a smaller resolution"
        )
    points = simplex_size(k, resolution)
    if points > max_points:
        raise ValueError(
            f"resolution {resolution} gives {points:,} grid points over {k} models, more than "
            f"the {max_points:,} allowed; choose a smaller resolution"
        )
    return points


def simplex_grid(
    k: int, resolution: int, *, max_points: int = MAX_SIMPLEX_POINTS
) -> list[tuple[float, ...]]:
    """All convex weights ``c / resolution`` over ``k`` models, vertices included.

    Ordered lexicographically by the integer counts, descending in the first weight:
    the first point is vertex 1, ``(1, 0, ..., 0)``. The size is checked first
    (:func:`check_simplex_size`), so an absurd resolution allocates nothing.
    """
    check_simplex_size(k, resolution, max_points=max_points)

    def counts(parts: int, total: int) -> list[tuple[int, ...]]:
        if parts == 1:
            return [(total,)]
        return [(c, *rest) for c in range(total, -1, -1) for rest in counts(parts - 1, total - c)]

    return [tuple(c / resolution for c in cs) for cs in counts(k, resolution)]


@dataclass(frozen=True)
class SimplexResult(JsonRecord):
    """Loss and accuracy at convex weights ``w`` of ``K`` models.

    Attributes:
        weights: one ``K``-tuple per grid point; every vertex is included.
        loss: mean loss at each point.
        acc: accuracy (fraction) at each point.
        meta: free-form description.
    """

    record_name: ClassVar[str] = "simplex result"

    weights: list[tuple[float, ...]]
    loss: list[float]
    acc: list[float]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (len(self.weights) == len(self.loss) == len(self.acc)) or not self.weights:
            raise ValueError("weights, loss and acc must have the same, non-zero length")
        k = len(self.weights[0])
        for w in self.weights:
            if len(w) != k or min(w) < -1e-9 or abs(sum(w) - 1.0) > 1e-6:
                raise ValueError(f"weights must be convex {k}-tuples, got {w}")
        for i in range(k):
            self._vertex(i)  # raises when a vertex is missing

    @property
    def k(self) -> int:
        """Number of models."""
        return len(self.weights[0])

    def _vertex(self, i: int) -> int:
        for idx, w in enumerate(self.weights):
            if abs(w[i] - 1.0) < 1e-9:
                return idx
        raise ValueError(f"the grid lacks vertex {i} (weight 1 on model {i})")

    @property
    def vertex_loss(self) -> list[float]:
        return [self.loss[self._vertex(i)] for i in range(self.k)]

    @property
    def vertex_acc(self) -> list[float]:
        return [self.acc[self._vertex(i)] for i in range(self.k)]

    def _excess_loss(self) -> list[float]:
        ends = self.vertex_loss
        return [
            v - sum(wk * e for wk, e in zip(w, ends, strict=True))
            for w, v in zip(self.weights, self.loss, strict=True)
        ]

    def _deficit_acc(self) -> list[float]:
        ends = self.vertex_acc
        return [
            sum(wk * e for wk, e in zip(w, ends, strict=True)) - v
            for w, v in zip(self.weights, self.acc, strict=True)
        ]

    @property
    def barrier_loss(self) -> float:
        """``max_w [L(theta(w)) - sum_k w_k L_k]``."""
        return max(self._excess_loss())

    @property
    def barrier_acc(self) -> float:
        """``max_w [sum_k w_k A_k - A(theta(w))]``."""
        return max(self._deficit_acc())

    @property
    def argmax_loss(self) -> tuple[float, ...]:
        """Weights where the loss barrier is attained."""
        excess = self._excess_loss()
        return self.weights[max(range(len(excess)), key=excess.__getitem__)]

    def _centroid_index(self) -> int | None:
        c = 1.0 / self.k
        return next(
            (i for i, w in enumerate(self.weights) if all(abs(x - c) < 1e-9 for x in w)), None
        )

    @property
    def has_centroid(self) -> bool:
        """Whether the centroid ``(1/K, ..., 1/K)`` is a grid point (``K`` divides the
        resolution)."""
        return self._centroid_index() is not None

    @property
    def centroid_loss(self) -> float:
        """Loss at the centroid ``(1/K, ..., 1/K)``; ``ValueError`` when it is not a grid
        point (a resolution that ``K`` does not divide)."""
        index = self._centroid_index()
        if index is None:
            raise ValueError(
                f"the centroid of {self.k} models is not a point of this grid (use a "
                f"resolution that is a multiple of {self.k}): its loss was not measured"
            )
        return self.loss[index]

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": [list(w) for w in self.weights],
            "loss": list(self.loss),
            "acc": list(self.acc),
            "barrier_loss": self.barrier_loss,
            "barrier_acc": self.barrier_acc,
            "argmax_loss": list(self.argmax_loss),
            "vertex_loss": self.vertex_loss,
            "vertex_acc": self.vertex_acc,
            # null when the centroid is not on the grid: only what was measured is reported
            "centroid_loss": self.centroid_loss if self.has_centroid else None,
            "meta": dict(self.meta),
        }

    @classmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> SimplexResult:
        return cls(
            [tuple(float(x) for x in w) for w in data["weights"]],
            [float(v) for v in data["loss"]],
            [float(v) for v in data["acc"]],
            dict(data.get("meta", {})),
        )


def evaluate_simplex(
    model: nn.Module,
    models: Sequence[Params],
    batches: Callable[[], Batches],
    *,
    resolution: int = 12,
    weights: Sequence[Sequence[float]] | None = None,
    prepare: PointFn | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: bool = False,
    batching: Batching | None = None,
) -> SimplexResult:
    """Evaluate every point of a barycentric grid over ``models``.

    All points run through ``model`` at once through ``torch.func.vmap`` where
    ``batching`` says so and the module allows, else one by one (same numbers; see
    :mod:`lmckit.measure._batched`); with a process group the batches are split across processes
    (:mod:`lmckit.runtime._distributed`).

    Args:
        model: module of the architecture.
        models: ``K >= 2`` parameter sets (align them into one frame first, e.g. with
            :func:`lmckit.aligners.universe_matching`).
        batches: callable returning a fresh iterable of ``(x, y)`` batches.
        resolution: grid resolution ``r >= 2`` (step ``1 / r`` in each weight; the
            centroid is a point when ``K`` divides ``r``, as for 2, 3, 4 and 6 models at
            the default 12).
        weights: explicit grid instead (must include every vertex).
        prepare: optional ``(theta_w, w) -> theta_w'`` at each point, e.g. a BatchNorm
            reset.
        meta: copied into the result.
        progress: progress bar.
        batching: how the points are run (default :class:`lmckit.measure._batched.Batching`).
    """
    if len(models) < 2:
        raise ValueError(f"a simplex needs at least 2 models, got {len(models)}")
    for other in models[1:]:
        check_compatible(models[0], other)
    grid = (
        [tuple(float(x) for x in w) for w in weights]
        if weights is not None
        else simplex_grid(len(models), resolution)
    )
    for w in grid:
        if len(w) != len(models):
            raise ValueError(f"weights {w} do not have one entry per model ({len(models)})")

    def theta(i: int) -> Params:
        point = weighted_average(models, grid[i])
        return point if prepare is None else prepare(point, grid[i])

    sums, units = point_sums(
        model, len(grid), theta, batches, task=CLASSIFICATION, batching=batching, progress=progress
    )
    if units == 0:
        raise ValueError("no data to evaluate on")
    losses, accs = [], []
    for w, (loss, acc) in zip(grid, sums.tolist(), strict=True):
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is not finite at weights {w}")
        losses.append(loss / units)
        accs.append(acc / units)
    return SimplexResult(grid, losses, accs, dict(meta or {}))
