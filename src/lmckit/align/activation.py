"""Activation matching (Ainsworth et al., 2023, Sec. 3.1; Li et al., 2015).

For each space, the two models' activations at the space's probes are compared unit
by unit: the cross-correlation (or cross-covariance) ``C[i, j]`` between unit ``i``
of the reference model and unit ``j`` of the other is accumulated batch by batch
from running sums, so activations are never all held in memory. Each space is then
solved independently by its group's solver (assignment for permutations,
Procrustes on the cross-covariance for orthogonal maps).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call
from tqdm.auto import tqdm

from lmckit.align.result import AlignmentResult, SpaceDiagnostics
from lmckit.align.solvers import objective, solve
from lmckit.params import Params, check_compatible, check_finite
from lmckit.symmetry import Orthogonal, SymmetrySpec, Transform

__all__ = [
    "CrossStatistics",
    "activation_matching",
    "collect_cross_statistics",
    "orthogonal_activation_matching",
]

Statistic = Literal["correlation", "covariance", "natural"]


@dataclass
class CrossStatistics:
    """Running sums for the cross-moments of two sets of ``n``-dim features."""

    count: int
    sum_a: Tensor  # (m,)
    sum_b: Tensor  # (n,)
    sum_aa: Tensor  # (m,) sums of squares
    sum_bb: Tensor  # (n,)
    sum_ab: Tensor  # (m, n)

    @classmethod
    def zeros(cls, m: int, n: int) -> CrossStatistics:
        z = torch.zeros
        f64 = torch.float64
        return cls(
            0,
            z(m, dtype=f64),
            z(n, dtype=f64),
            z(m, dtype=f64),
            z(n, dtype=f64),
            z(m, n, dtype=f64),
        )

    def update(self, a: Tensor, b: Tensor) -> None:
        """Add samples ``a`` (``(N, m)``) and ``b`` (``(N, n)``)."""
        a = a.double()
        b = b.double()
        self.count += a.shape[0]
        self.sum_a += a.sum(0)
        self.sum_b += b.sum(0)
        self.sum_aa += (a * a).sum(0)
        self.sum_bb += (b * b).sum(0)
        self.sum_ab += a.T @ b

    def covariance(self) -> Tensor:
        """``(m, n)`` cross-covariance ``E[ab] - E[a]E[b]``."""
        if self.count == 0:
            raise ValueError("no samples were accumulated")
        mean_a = self.sum_a / self.count
        mean_b = self.sum_b / self.count
        return self.sum_ab / self.count - mean_a[:, None] * mean_b[None, :]

    def correlation(self, eps: float = 1e-8) -> Tensor:
        """``(m, n)`` Pearson cross-correlation."""
        mean_a = self.sum_a / self.count
        mean_b = self.sum_b / self.count
        std_a = (self.sum_aa / self.count - mean_a**2).clamp_min(0).sqrt()
        std_b = (self.sum_bb / self.count - mean_b**2).clamp_min(0).sqrt()
        return self.covariance() / (std_a[:, None] * std_b[None, :] + eps)


def _features(x: Tensor, axis: int) -> Tensor:
    """``(samples, features)``: every position other than the feature axis is a sample."""
    return x.movedim(axis % x.ndim, -1).reshape(-1, x.shape[axis])


def collect_cross_statistics(
    model: nn.Module,
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    inputs: Iterable[Tensor],
    *,
    spaces: Sequence[str] | None = None,
    progress: bool = False,
) -> dict[str, CrossStatistics]:
    """Stream ``inputs`` through both models and accumulate per-space cross statistics.

    Each space's probes (module outputs) are hooked; a space with several probes (a
    residual stream) pools the samples of all of them.
    """
    names = list(spec.names if spaces is None else spaces)
    wanted = {}
    for name in names:
        space = spec[name]
        if not space.probes:
            raise ValueError(f"space {name!r} has no probes: activation matching cannot see it")
        for probe in space.probes:
            wanted.setdefault(probe.module, []).append((name, probe.axis))
    modules = dict(model.named_modules())
    missing = [m for m in wanted if m not in modules]
    if missing:
        raise ValueError(f"probe modules not in the model: {missing}")

    captured: dict[str, Tensor] = {}

    def hook(name: str):
        def fn(_module: nn.Module, _inputs: tuple, output: Tensor) -> None:
            captured[name] = output.detach()

        return fn

    handles = [modules[m].register_forward_hook(hook(m)) for m in wanted]
    stats: dict[str, CrossStatistics] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for x in tqdm(inputs, desc="activation statistics", disable=not progress, leave=False):
                captured.clear()
                functional_call(model, params_a, (x,))
                acts_a = dict(captured)
                captured.clear()
                functional_call(model, params_b, (x,))
                for module_name, targets in wanted.items():
                    for space_name, axis in targets:
                        fa = _features(acts_a[module_name], axis)
                        fb = _features(captured[module_name], axis)
                        if space_name not in stats:
                            stats[space_name] = CrossStatistics.zeros(fa.shape[1], fb.shape[1])
                        stats[space_name].update(fa, fb)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if not stats:
        raise ValueError("no input batches were given")
    return stats


def activation_matching(
    model: nn.Module,
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    inputs: Iterable[Tensor],
    *,
    statistic: Statistic = "correlation",
    spaces: Sequence[str] | None = None,
    progress: bool = False,
) -> AlignmentResult:
    """Align ``params_b`` to ``params_a`` by matching activations on ``inputs``.

    Args:
        model: the module both parameter sets run through.
        spec: its symmetry spec (every solved space needs probes).
        params_a, params_b: reference and model to align; unchanged.
        inputs: iterable of input batches (e.g. training images, no labels).
        statistic: ``"correlation"`` (default for permutations), ``"covariance"``
            (natural for orthogonal maps: Procrustes on the cross-covariance), or
            ``"natural"``: covariance for ``Orthogonal`` spaces, correlation for the rest.
        spaces: solve only these spaces; default all.
        progress: progress bar over batches.
    """
    if statistic not in ("correlation", "covariance", "natural"):
        raise ValueError(
            f"statistic must be 'correlation', 'covariance' or 'natural', got {statistic!r}"
        )
    check_compatible(params_a, params_b)
    check_finite(params_a, what="first model")
    check_finite(params_b, what="second model")
    spec.validate(params_b)
    start = time.perf_counter()
    stats = collect_cross_statistics(
        model, spec, params_a, params_b, inputs, spaces=spaces, progress=progress
    )
    elements = {}
    diagnostics = {}
    for name, st in stats.items():
        group = spec[name].group
        use = statistic
        if use == "natural":
            use = "covariance" if isinstance(group, Orthogonal) else "correlation"
        sim = (st.correlation() if use == "correlation" else st.covariance()).float()
        element = solve(group, sim)
        elements[name] = element
        diagnostics[name] = SpaceDiagnostics(
            objective(group, group.identity(spec[name].n), sim), objective(group, element, sim)
        )
    return AlignmentResult(
        transform=Transform(spec, elements),
        spaces=diagnostics,
        seconds=time.perf_counter() - start,
    )


def orthogonal_activation_matching(
    model: nn.Module,
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    inputs: Iterable[Tensor],
) -> Transform:
    """Activation matching with each space's natural statistic, e.g. RMSNorm transformers.

    Orthogonal spaces (a residual stream) get the map maximising ``tr(O^T C)`` for the
    cross-covariance ``C`` of the two models' activations (Pearson normalisation is not
    orthogonally equivariant); every other space (heads, MLP units) is permuted by
    Pearson correlation. Both statistics come from one pass over ``inputs``.

    Returns:
        The transform aligning ``params_b`` to ``params_a``.
    """
    if not any(isinstance(s.group, Orthogonal) for s in spec):
        raise ValueError("orthogonal activation matching needs an Orthogonal space")
    return activation_matching(
        model, spec, params_a, params_b, inputs, statistic="natural"
    ).transform
