"""How an elastic band grows (AutoNEB): where it rises above its chords, and new pivots there.

Used by :mod:`lmckit.paths._neb`: after a training cycle the loss is measured at a few
points inside every segment between neighbouring pivots; a pivot is inserted where a
point lies furthest above the chord between its segment's pivots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmckit.measure._batched import point_sums
from lmckit.paths._flat import FlatPacking
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params
from lmckit.training._task import Task

__all__ = ["BandState", "insert_pivots", "segment_scores"]

Batches = Iterable[tuple[Tensor, Tensor]]


@dataclass
class BandState:
    """A band while it trains.

    Attributes:
        coords: ``(nodes, D)`` flat trainable parameters of every node; row 0 is the
            start, the last row the end.
        bases: every node's full parameter set (the untrained tensors are read from it).
        packing: how a row maps to the trainable tensors.
    """

    coords: Tensor
    bases: list[Params]
    packing: FlatPacking


def segment_scores(
    model: nn.Module, state: BandState, probe: Callable[[], Batches], probes: int, task: Task
) -> tuple[Tensor, Tensor]:
    """Loss of every node and, per segment, the loss of ``probes`` inner points above the
    chord of its ends: ``(node_losses (n,), scores (n - 1, probes))``."""
    n = state.coords.shape[0]
    alphas = [(j + 1) / (probes + 1) for j in range(probes)]
    where = [(i, 0.0) for i in range(n)] + [(i, a) for i in range(n - 1) for a in alphas]

    def point(k: int) -> Params:
        i, a = where[k]
        row = state.coords[i] if a == 0.0 else (1 - a) * state.coords[i] + a * state.coords[i + 1]
        base = state.bases[i] if a == 0.0 else interpolate(state.bases[i], state.bases[i + 1], a)
        return state.packing.unpack(row, base)

    sums, units = point_sums(model, len(where), point, probe, task=task)
    values = sums[:, 0] / max(units, 1)
    nodes = values[:n]
    inner = values[n:].reshape(n - 1, probes)
    a = torch.tensor(alphas, dtype=values.dtype)
    chord = (1 - a) * nodes[:-1, None] + a * nodes[1:, None]
    return nodes, inner - chord


def insert_pivots(
    model: nn.Module,
    state: BandState,
    probe: Callable[[], Batches],
    count: int,
    probes: int,
    threshold: float,
    task: Task,
) -> int:
    """Insert up to ``count`` pivots (one per segment) where the band rises most above
    its chords, by more than ``threshold`` of its loss range; returns how many."""
    nodes, scores = segment_scores(model, state, probe, probes, task)
    spread = float(nodes.max() - nodes.min())
    best, where = scores.max(dim=1)
    order = [int(i) for i in torch.argsort(best, descending=True)[:count]]
    chosen = sorted(i for i in order if float(best[i]) > threshold * max(spread, 1e-12))
    for offset, seg in enumerate(chosen):
        i = seg + offset  # earlier insertions shift the later segments
        a = (int(where[seg]) + 1) / (probes + 1)
        row = (1 - a) * state.coords[i] + a * state.coords[i + 1]
        state.coords = torch.cat([state.coords[: i + 1], row[None], state.coords[i + 1 :]])
        state.bases.insert(i + 1, interpolate(state.bases[i], state.bases[i + 1], a))
    return len(chosen)
