"""The plane through three parameter sets: an orthonormal frame, a grid, the loss on it.

For models ``A``, ``B``, ``C`` the plane's frame comes from Gram-Schmidt in weight space
(the Euclidean inner product over the tensors named in ``names``, by default every
floating-point one): ``u = (B - A) / |B - A|``, ``v`` the part of ``C - A``
perpendicular to ``u``, normalised. A point of the plane has coordinates ``(x, y)``
(weight-space distance along ``u`` and ``v``) and is ``A + x u + y v``; the models sit
at ``A = (0, 0)``, ``B = (|B - A|, 0)``, ``C = ((C - A) . u, |v'|)``.

Points are built as the affine combination ``(1 - a - b) A + a B + b C`` with the
weights that give ``A + x u + y v``: nothing of the size of a model is stored for the
frame, every tensor (BatchNorm statistics too) is combined alike, and at a model's own
coordinates the point is that model (weights 0 and 1). Tensors outside ``names`` take
part in the combination but not in the geometry.

Three collinear models span no plane: :func:`plane_frame` refuses them by name.
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
from lmckit.training._task import CLASSIFICATION, Task

__all__ = [
    "COLLINEAR_TOLERANCE",
    "MAX_PLANE_RESOLUTION",
    "PlaneFrame",
    "PlaneResult",
    "evaluate_plane",
    "plane_axes",
    "plane_frame",
]

#: ``C`` counts as on the line through ``A`` and ``B`` when its distance from that line
#: is below this fraction of ``|C - A|`` (float32 rounding of a model built on the line
#: is ~1e-7 of it).
COLLINEAR_TOLERANCE = 1e-4
#: Most points per axis of a plane's grid (``resolution ** 2`` evaluations).
MAX_PLANE_RESOLUTION = 301

Batches = Iterable[tuple[Tensor, Tensor]]
PointFn = Callable[[Params, tuple[float, float]], Params]


def _dot(p: Mapping[str, Tensor], q: Mapping[str, Tensor], names: Iterable[str]) -> float:
    """``p . q`` over ``names``, in float64, one tensor at a time."""
    return sum(float((p[n].double() * q[n].double()).sum()) for n in names)


def _difference_dots(
    base: Mapping[str, Tensor], others: Sequence[Mapping[str, Tensor]], names: Sequence[str]
) -> list[list[float]]:
    """The Gram matrix of ``other_i - base`` over ``names`` (float64, tensor by tensor)."""
    k = len(others)
    gram = [[0.0] * k for _ in range(k)]
    for n in names:
        origin = base[n].double()
        diffs = [o[n].double() - origin for o in others]
        for i in range(k):
            for j in range(i, k):
                value = float((diffs[i] * diffs[j]).sum())
                gram[i][j] += value
                if i != j:
                    gram[j][i] += value
    return gram


@dataclass(frozen=True)
class PlaneFrame:
    """Coordinates in the plane through ``A``, ``B``, ``C`` (module docstring).

    Attributes:
        b_x: ``|B - A|``, B's x (B's y is 0).
        c_x, c_y: C's coordinates (``c_y > 0``).
        names: the tensors the geometry is measured over.
    """

    b_x: float
    c_x: float
    c_y: float
    names: tuple[str, ...]

    @property
    def models_xy(self) -> list[tuple[float, float]]:
        """``A``, ``B``, ``C``'s coordinates."""
        return [(0.0, 0.0), (self.b_x, 0.0), (self.c_x, self.c_y)]

    def weights(self, x: float, y: float) -> tuple[float, float, float]:
        """The affine weights of ``A``, ``B``, ``C`` of the point ``(x, y)`` (sum 1)."""
        beta = y / self.c_y
        alpha = (x - beta * self.c_x) / self.b_x
        return (1.0 - alpha - beta, alpha, beta)

    def point(self, models: Sequence[Mapping[str, Tensor]], x: float, y: float) -> Params:
        """The parameters at ``(x, y)``; ``models`` are ``A``, ``B``, ``C``."""
        return weighted_average(list(models), list(self.weights(x, y)))

    def project(
        self, models: Sequence[Mapping[str, Tensor]], theta: Mapping[str, Tensor]
    ) -> tuple[float, float]:
        """The coordinates of ``theta``'s orthogonal projection onto the plane."""
        gram = _difference_dots(models[0], [models[1], models[2], theta], self.names)
        along_u = gram[0][2] / self.b_x  # (theta - A) . u
        along_c = gram[1][2]  # (theta - A) . (C - A)
        return along_u, (along_c - self.c_x * along_u) / self.c_y


def plane_frame(
    a: Mapping[str, Tensor],
    b: Mapping[str, Tensor],
    c: Mapping[str, Tensor],
    *,
    names: Sequence[str] | None = None,
    tolerance: float = COLLINEAR_TOLERANCE,
) -> PlaneFrame:
    """The Gram-Schmidt frame of the plane through ``a``, ``b``, ``c``.

    Args:
        a, b, c: parameter sets of one architecture.
        names: the tensors spanning weight space (default: every floating-point one);
            e.g. a module's trainable parameters, leaving BatchNorm statistics out.
        tolerance: ``c`` closer to the line through ``a`` and ``b`` than this fraction
            of ``|c - a|`` is refused.

    Raises:
        IncompatibleModelsError: the three differ in names or shapes.
        ValueError: ``a`` and ``b`` coincide, or the three are collinear.
    """
    check_compatible(a, b)
    check_compatible(a, c)
    spanned = (
        tuple(names)
        if names is not None
        else tuple(k for k, v in a.items() if v.is_floating_point())
    )
    missing = [n for n in spanned if n not in a]
    if missing:
        raise ValueError(f"names lists tensors the models lack: {missing[:3]}")
    gram = _difference_dots(a, [b, c], spanned)
    b_x = math.sqrt(gram[0][0])
    c_norm = math.sqrt(gram[1][1])
    if b_x == 0.0:
        raise ValueError("the first two models are the same point: they span no plane")
    if c_norm == 0.0:
        raise ValueError("the third model is the first: the three span no plane")
    c_x = gram[0][1] / b_x
    # C's distance from the line, from its explicit perpendicular part (a difference of
    # squares would cancel catastrophically for a C on the line)
    ratio = c_x / b_x
    perp = sum(
        float(
            ((c[n].double() - a[n].double()) - ratio * (b[n].double() - a[n].double())).pow(2).sum()
        )
        for n in spanned
    )
    c_y = math.sqrt(perp)
    if c_y <= tolerance * c_norm:
        raise ValueError(
            f"the three models are collinear in weight space (the third lies "
            f"{c_y / c_norm:.2g} of its distance from the first off the line through the "
            "other two): they span no plane"
        )
    return PlaneFrame(b_x, c_x, c_y, spanned)


def plane_axes(
    frame: PlaneFrame, resolution: int, margin: float
) -> tuple[list[float], list[float]]:
    """Grid values of ``x`` and ``y``: ``resolution`` evenly spaced values each, over the
    models' bounding box widened on every side by ``margin`` times its larger side.

    Raises:
        ValueError: a resolution below 2 or above :data:`MAX_PLANE_RESOLUTION`, or a
            negative or non-finite margin.
    """
    if not 2 <= resolution <= MAX_PLANE_RESOLUTION:
        raise ValueError(
            f"resolution must be between 2 and {MAX_PLANE_RESOLUTION} points per axis, got "
            f"{resolution}"
        )
    if not 0.0 <= margin < math.inf:
        raise ValueError(f"margin must be a finite number >= 0, got {margin}")
    xs = [p[0] for p in frame.models_xy]
    ys = [p[1] for p in frame.models_xy]
    pad = margin * max(max(xs) - min(xs), max(ys) - min(ys))
    low_x, high_x = min(xs) - pad, max(xs) + pad
    low_y, high_y = min(ys) - pad, max(ys) + pad
    step = resolution - 1
    return (
        [low_x + (high_x - low_x) * i / step for i in range(resolution)],
        [low_y + (high_y - low_y) * j / step for j in range(resolution)],
    )


@dataclass(frozen=True)
class PlaneResult(JsonRecord):
    """Loss and metric on a grid over the plane through three models.

    JSON (:meth:`to_dict`): ``{"models": [{"path", "xy", "loss", "acc", "plane_loss",
    "plane_acc"}], "grid": {"x", "y", "loss", "acc"}, "curve": [[x, y], ...] or null,
    "meta"}``; ``grid["loss"][j][i]`` is the loss at ``(x[i], y[j])`` (one row per
    ``y``, as ``matplotlib.pyplot.contourf(x, y, loss)`` reads it).

    Attributes:
        x, y: the grid's axes (weight-space distances along ``u`` and ``v``).
        loss, acc: ``len(y)`` rows of ``len(x)`` values.
        models: one entry per model: ``path`` (a name), ``xy``, ``loss`` and ``acc``
            of the model evaluated as itself, ``plane_loss`` and ``plane_acc`` of the
            plane's point at ``xy`` (the same up to rounding, and up to the point's fix,
            e.g. a BatchNorm reset).
        curve: a curve's points projected onto the plane, if one was given.
        meta: free-form description.
    """

    record_name: ClassVar[str] = "plane result"

    x: list[float]
    y: list[float]
    loss: list[list[float]]
    acc: list[list[float]]
    models: list[dict[str, Any]]
    curve: list[list[float]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shape_ok = len(self.loss) == len(self.acc) == len(self.y) and all(
            len(row) == len(self.x) for row in (*self.loss, *self.acc)
        )
        if not shape_ok or len(self.x) < 2 or len(self.y) < 2:
            raise ValueError("loss and acc must hold len(y) rows of len(x) values, at least 2x2")

    def to_dict(self) -> dict[str, Any]:
        return {
            "models": [dict(m) for m in self.models],
            "grid": {"x": self.x, "y": self.y, "loss": self.loss, "acc": self.acc},
            "curve": self.curve,
            "meta": dict(self.meta),
        }

    @classmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> PlaneResult:
        grid = data["grid"]
        return cls(
            [float(v) for v in grid["x"]],
            [float(v) for v in grid["y"]],
            [[float(v) for v in row] for row in grid["loss"]],
            [[float(v) for v in row] for row in grid["acc"]],
            [dict(m) for m in data["models"]],
            data.get("curve"),
            dict(data.get("meta", {})),
        )


def _model_entries(
    frame: PlaneFrame,
    labels: Sequence[str],
    alone: Sequence[Sequence[float]],
    on_plane: Sequence[Sequence[float]],
) -> list[dict[str, Any]]:
    """Each model's entry of a :class:`PlaneResult` from its ``[loss, metric]`` as itself
    and at its coordinates."""
    return [
        {
            "path": labels[k],
            "xy": list(frame.models_xy[k]),
            "loss": alone[k][0],
            "acc": alone[k][1],
            "plane_loss": on_plane[k][0],
            "plane_acc": on_plane[k][1],
        }
        for k in range(3)
    ]


def evaluate_plane(
    model: nn.Module,
    models: Sequence[Mapping[str, Tensor]],
    frame: PlaneFrame,
    batches: Callable[[], Batches],
    *,
    xs: Sequence[float],
    ys: Sequence[float],
    labels: Sequence[str] = ("A", "B", "C"),
    prepare: PointFn | None = None,
    curve: Sequence[Mapping[str, Tensor]] = (),
    meta: Mapping[str, Any] | None = None,
    progress: bool = False,
    task: Task = CLASSIFICATION,
    batching: Batching | None = None,
) -> PlaneResult:
    """Loss and metric at every grid point ``(x, y)``, at each model's coordinates, and of
    each model as itself: one run of :func:`lmckit.measure._batched.point_sums` (batched where
    ``batching`` says so; batches split across processes under a process group).

    Args:
        model: module of the architecture.
        models: ``A``, ``B``, ``C``, the models the frame was made from.
        frame: from :func:`plane_frame`.
        batches: callable returning fresh ``(x, y)`` batches.
        xs, ys: grid axes (e.g. :func:`plane_axes`).
        labels: the models' names in the result.
        prepare: ``(theta, (x, y)) -> theta'`` at every plane point (e.g. a BatchNorm
            reset); the models as themselves are not prepared.
        curve: points of a curve to project onto the plane (for drawing).
        meta, progress, task, batching: as for :func:`lmckit.measure._evaluate.evaluate_along`.
    """
    if len(models) != 3 or len(labels) != 3:
        raise ValueError(f"a plane needs 3 models and 3 labels, got {len(models)}, {len(labels)}")
    where = [(x, y) for y in ys for x in xs] + frame.models_xy
    grid_points = len(xs) * len(ys)

    def point(i: int) -> Mapping[str, Tensor]:
        if i >= len(where):  # a model as itself
            return models[i - len(where)]
        theta = frame.point(models, *where[i])
        return theta if prepare is None else prepare(theta, where[i])

    sums, units = point_sums(
        model, len(where) + 3, point, batches, task=task, batching=batching, progress=progress
    )
    if units == 0:
        raise ValueError("no data to evaluate on")
    values = (sums / units).tolist()
    for i, (loss, _) in enumerate(values):
        if not math.isfinite(loss):
            at = f"plane point {where[i]}" if i < len(where) else labels[i - len(where)]
            raise FloatingPointError(f"loss is not finite at {at}")
    rows = [values[j * len(xs) : (j + 1) * len(xs)] for j in range(len(ys))]
    entries = _model_entries(frame, labels, values[len(where) :], values[grid_points:])
    projected = [list(frame.project(models, p)) for p in curve] if curve else None
    return PlaneResult(
        list(xs),
        list(ys),
        [[v[0] for v in row] for row in rows],
        [[v[1] for v in row] for row in rows],
        entries,
        projected,
        dict(meta or {}),
    )
