"""Figures: loss and accuracy along paths (PNG, written atomically)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI; set before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402

from lmckit.atomic import atomic_path  # noqa: E402
from lmckit.evaluate import PathResult  # noqa: E402

__all__ = ["plot_paths"]


def plot_paths(
    results: Mapping[str, PathResult], path: str | Path, *, title: str | None = None
) -> Path:
    """Plot loss (left) and accuracy (right) against ``t`` for each named path.

    Legends carry each path's loss and accuracy barrier. Returns the written path.
    """
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
    if title:
        fig.suptitle(title)
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
