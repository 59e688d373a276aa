"""Figures: loss and accuracy along paths, over simplices and planes (PNG, written atomically).

Every figure carries lmckit's mark in its metadata (PNG, PDF, SVG, PS, EPS;
:func:`lmckit.outputs._own_files.plot_metadata`), so that drawing it again may replace it
while a user's image of the same name is refused (:func:`lmckit.outputs.check_output_file`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI; set before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402

from lmckit.measure._evaluate import PathResult  # noqa: E402
from lmckit.outputs import check_output_file  # noqa: E402
from lmckit.outputs._atomic import atomic_path  # noqa: E402
from lmckit.outputs._own_files import plot_metadata  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from lmckit.paths._plane import PlaneResult
    from lmckit.paths._simplex import SimplexResult

__all__ = ["PLOT_SUFFIXES", "plot_paths", "plot_planes", "plot_simplex"]

#: File suffixes a figure can be written as (matplotlib's formats that need no LaTeX
#: and are files, not raw buffers).
PLOT_SUFFIXES: tuple[str, ...] = tuple(
    sorted(
        f".{fmt}"
        for fmt in matplotlib.backend_bases.FigureCanvasBase.get_supported_filetypes()
        if fmt not in ("pgf", "raw", "rgba")
    )
)


def plot_paths(
    results: Mapping[str, PathResult],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Plot loss (left) and accuracy (right) against ``t`` for each named path.

    Legends carry each path's loss and accuracy barrier. Returns the written path.
    ``overwrite``: replace an existing file lmckit did not draw (a figure lmckit drew is
    replaced anyway).

    Raises:
        OutputError: ``path`` is a folder, a device, not an image type
            (:data:`PLOT_SUFFIXES`), or a file lmckit did not write (without ``overwrite``).
    """
    check_output_file(path, suffixes=PLOT_SUFFIXES, force=overwrite)
    if not results:
        raise ValueError("nothing to plot")
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for name, res in results.items():
        ax_loss.plot(
            res.t, res.loss, marker="o", ms=3, label=f"{name} (barrier {res.barrier_loss:.3f})"
        )
        ax_acc.plot(
            res.t,
            [100 * a for a in res.acc],
            marker="o",
            ms=3,
            label=f"{name} (barrier {100 * res.barrier_acc:.2f} pts)",
        )
    ax_loss.set(xlabel="t  (model A → model B)", ylabel="loss", title="loss along the path")
    ax_acc.set(
        xlabel="t  (model A → model B)", ylabel="accuracy (%)", title="accuracy along the path"
    )
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path, title)


def _save(fig: Figure, path: str | os.PathLike[str], title: str | None) -> Path:
    """Title ``fig``, write it to ``path`` (format from the suffix, atomically), close it."""
    path = Path(path)
    if title:
        fig.suptitle(title)
    fmt = path.suffix.lower().lstrip(".") or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format=fmt, metadata=plot_metadata(fmt))
    plt.close(fig)
    return path


def plot_simplex(
    results: Mapping[str, SimplexResult],
    path: str | Path,
    *,
    metric: str = "loss",
    labels: Sequence[str] = ("model 1", "model 2", "model 3"),
    title: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Triangle heat maps of loss (or accuracy) over 3-model simplices, one per result.

    Barycentric weights ``w`` map to the plane as ``w_1 v_1 + w_2 v_2 + w_3 v_3`` with
    the vertices of an equilateral triangle; all panels share one colour scale, and
    the point attaining each loss barrier is marked. Returns the written path.
    ``overwrite``: as for :func:`plot_paths`.

    Raises:
        OutputError: as for :func:`plot_paths`.
    """
    import numpy as np

    check_output_file(path, suffixes=PLOT_SUFFIXES, force=overwrite)
    from matplotlib.tri import Triangulation

    if not results:
        raise ValueError("nothing to plot")
    if metric not in ("loss", "acc"):
        raise ValueError(f"metric must be 'loss' or 'acc', got {metric!r}")
    if len(labels) != 3:
        raise ValueError(f"need 3 vertex labels, got {len(labels)}")
    for name, res in results.items():
        if res.k != 3:
            raise ValueError(f"{name}: a triangle plot needs 3 models, got {res.k}")
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3) / 2]])
    values = {
        name: np.array(res.loss if metric == "loss" else [100 * a for a in res.acc])
        for name, res in results.items()
    }
    low = min(float(v.min()) for v in values.values())
    high = max(float(v.max()) for v in values.values())
    fig, axes = plt.subplots(
        1, len(results), figsize=(4.6 * len(results), 4.2), constrained_layout=True, squeeze=False
    )
    image = None
    for ax, (name, res) in zip(axes[0], results.items(), strict=True):
        xy = np.array(res.weights) @ corners
        tri = Triangulation(xy[:, 0], xy[:, 1])
        image = ax.tripcolor(tri, values[name], shading="gouraud", vmin=low, vmax=high)
        peak = np.array(res.argmax_loss) @ corners
        ax.plot(*peak, marker="x", color="white", ms=9, mew=2)
        ax.plot(*np.vstack([corners, corners[:1]]).T, color="black", lw=1)
        for corner, label, ha in zip(corners, labels, ("right", "left", "center"), strict=True):
            ax.annotate(
                label,
                corner,
                xytext=(0, -12 if corner[1] == 0 else 6),
                textcoords="offset points",
                ha=ha,
                fontsize=9,
            )
        ax.set_title(
            f"{name}\nbarrier: loss {res.barrier_loss:.3f}, acc {100 * res.barrier_acc:.2f} pts",
            fontsize=10,
        )
        ax.set_aspect("equal")
        ax.axis("off")
    assert image is not None  # results is not empty
    fig.colorbar(
        image, ax=axes[0].tolist(), shrink=0.8, label=metric if metric == "loss" else "accuracy (%)"
    )
    return _save(fig, path, title)


def plot_planes(
    results: Mapping[str, PlaneResult],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    levels: int = 24,
) -> Path:
    """Filled contours of the loss over planes through three models, one panel per result.

    The colours are log-spaced (``levels`` levels between the lowest and highest loss of
    all panels, one shared scale); each model is marked and named, the straight line from
    the first to the second drawn dashed, and a curve's projection drawn solid when the
    result holds one. Axes are weight-space distances, equal in scale. Returns the
    written path.

    Raises:
        OutputError: ``path`` is a folder or not an image type (:data:`PLOT_SUFFIXES`).
    """
    import numpy as np
    from matplotlib.colors import LogNorm

    check_output_file(path, suffixes=PLOT_SUFFIXES)
    if not results:
        raise ValueError("nothing to plot")
    grids = {name: np.asarray(r.loss, dtype=float) for name, r in results.items()}
    low = max(min(float(g.min()) for g in grids.values()), 1e-6)
    high = max(max(float(g.max()) for g in grids.values()), low * 1.01)
    bounds = np.geomspace(low, high, levels)
    # panels as tall as the planes are (equal axes), within reason
    aspect = max((max(r.y) - min(r.y)) / max(max(r.x) - min(r.x), 1e-12) for r in results.values())
    height = min(max(4.6 * aspect, 2.2), 6.0) + 1.3
    fig, axes = plt.subplots(
        1,
        len(results),
        figsize=(4.6 * len(results) + 1.2, height),
        constrained_layout=True,
        squeeze=False,
    )
    norm = LogNorm(low, high)
    for ax, (name, res) in zip(axes[0], results.items(), strict=True):
        image = ax.contourf(
            res.x, res.y, np.clip(grids[name], low, high), levels=bounds, norm=norm, cmap="viridis"
        )
        _draw_plane_paths(ax, res)
        ax.set_title(name, fontsize=10)
    bar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.9, label="loss (log scale)")
    ticks = _log_ticks(low, high)
    bar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
    bar.ax.minorticks_off()
    return _save(fig, path, title)


def _log_ticks(low: float, high: float) -> list[float]:
    """1, 1.5, 2, 3, 5, 7 times powers of ten between ``low`` and ``high``."""
    return [
        m * 10.0**e
        for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        for m in (1, 1.5, 2, 3, 5, 7)
        if low <= m * 10.0**e <= high
    ]


def _draw_plane_paths(ax: Axes, res: PlaneResult) -> None:
    """The straight line (dashed), a curve's projection and the named models on a plane."""
    (ax_, ay), (bx, by) = res.models[0]["xy"], res.models[1]["xy"]
    ax.plot([ax_, bx], [ay, by], "--", color="white", lw=1.2, label="straight line")
    if res.curve:
        cx, cy = zip(*res.curve, strict=True)
        ax.plot(cx, cy, "-", color="orange", lw=1.6, label="curve")
        ax.legend(fontsize=8, loc="lower right")
    middle = (min(res.x) + max(res.x)) / 2
    for model in res.models:
        x, y = model["xy"]
        ax.plot(x, y, "o", color="white", mec="black", ms=7)
        right = x > middle  # names of models on the right run leftwards, inside the axes
        ax.annotate(
            str(model["path"]),
            (x, y),
            xytext=(-5 if right else 5, 5),
            textcoords="offset points",
            ha="right" if right else "left",
            color="white",
            fontsize=9,
            fontweight="bold",
        )
    ax.set_aspect("equal")
    ax.set_xlabel("distance along u (B - A)")
    ax.set_ylabel("distance along v")
