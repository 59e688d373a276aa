"""Cross statistics of two models' activations, streamed batch by batch.

For each space, the two models' activations at the space's probes (module outputs, or
inputs) are compared unit by unit: the running sums of :class:`CrossStatistics` give the
cross-correlation (or cross-covariance) ``C[i, j]`` between unit ``i`` of the reference
model and unit ``j`` of the other without holding the activations in memory; over a
process group the sums are added up over processes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.hooks import RemovableHandle
from tqdm.auto import tqdm

from lmckit.runtime._distributed import any_rank, is_distributed, shard, sum_over_ranks, world
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import SymmetrySpec

__all__ = ["CrossStatistics", "collect_cross_statistics"]


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
    def zeros(cls, m: int, n: int, *, device: torch.device | None = None) -> CrossStatistics:
        def z(*shape: int) -> Tensor:
            return torch.zeros(*shape, dtype=torch.float64, device=device)

        return cls(0, z(m), z(n), z(m), z(n), z(m, n))

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


def _first_tensor(value: object) -> Tensor:
    """The tensor a hook sees: a module's output or first input (tuples: first tensor)."""
    if isinstance(value, Tensor):
        return value.detach()
    if isinstance(value, tuple | list) and value and isinstance(value[0], Tensor):
        return value[0].detach()
    raise TypeError(f"a probe saw a {type(value).__name__}, not a tensor")


def collect_cross_statistics(
    model: nn.Module,
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    inputs: Iterable[Tensor],
    *,
    spaces: Sequence[str] | None = None,
    progress: bool = False,
    device: str | torch.device | None = None,
) -> dict[str, CrossStatistics]:
    """Stream ``inputs`` through both models and accumulate per-space cross statistics.

    Each space's probes (module outputs, or inputs with ``Probe.input``) are hooked; a
    space with several probes (a residual stream) pools the samples of all of them, and
    a probed module run several times per pass (one layer's weights used by several
    layers) the samples of every call. With ``device``, the passes and the sums run
    there (on a copy of ``model``); the statistics stay there. With a process group
    (:mod:`lmckit.runtime._distributed`) each process streams every ``W``-th batch and
    the sums are added up over processes: every process returns the statistics of all
    the batches (each process needs at least one).
    """
    wanted = _probe_sites(spec, list(spec.names if spaces is None else spaces))
    model, params_a, params_b, dev = _on_device(model, params_a, params_b, device)
    modules = dict(model.named_modules())
    missing = [m for m, _ in wanted if m not in modules]
    if missing:
        raise ValueError(f"probe modules not in the model: {missing}")
    # every call of a probed module (a layer whose weights serve several layers, as
    # ALBERT's): the same element must serve all of them, so their samples are pooled
    captured: dict[ProbeSite, list[Tensor]] = {}
    handles = _hook_probes(modules, wanted, captured)
    stats: dict[str, CrossStatistics] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            local = shard(inputs)
            for x in tqdm(local, desc="activation statistics", disable=not progress, leave=False):
                x = x.to(dev)
                captured.clear()
                functional_call(model, params_a, (x,))
                acts_a = dict(captured)
                captured.clear()
                functional_call(model, params_b, (x,))
                _accumulate(stats, wanted, acts_a, captured)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if is_distributed():
        _sum_over_ranks(stats)
    if not stats:
        raise ValueError("no input batches were given")
    return stats


#: Where a probe reads: ``(module name, whether its input rather than its output)``.
ProbeSite = tuple[str, bool]


def _probe_sites(spec: SymmetrySpec, names: list[str]) -> dict[ProbeSite, list[tuple[str, int]]]:
    """``{probe site: [(space, feature axis), ...]}`` of the spaces ``names``; a space
    without probes is refused (activation matching cannot see it)."""
    wanted: dict[ProbeSite, list[tuple[str, int]]] = {}
    for name in names:
        space = spec[name]
        if not space.probes:
            raise ValueError(f"space {name!r} has no probes: activation matching cannot see it")
        for probe in space.probes:
            wanted.setdefault((probe.module, probe.input), []).append((name, probe.axis))
    return wanted


def _on_device(
    model: nn.Module, params_a: Params, params_b: Params, device: str | torch.device | None
) -> tuple[nn.Module, dict[str, Tensor], dict[str, Tensor], torch.device]:
    """The model and both parameter sets as built tensors on ``device`` (a copy of the
    model off the CPU), and the device."""
    # forward passes need built tensors: a model computed when read (folded norm scales,
    # lmckit.inference._fold) is built once here, not at every batch
    params_a = params_a if isinstance(params_a, dict) else dict(params_a)
    params_b = params_b if isinstance(params_b, dict) else dict(params_b)
    dev = torch.device(device or "cpu")
    if dev.type != "cpu":
        model = copy.deepcopy(model).to(dev)
        params_a = {k: v.to(dev) for k, v in params_a.items()}
        params_b = {k: v.to(dev) for k, v in params_b.items()}
    return model, params_a, params_b, dev


def _hook_probes(
    modules: dict[str, nn.Module],
    wanted: Iterable[ProbeSite],
    captured: dict[ProbeSite, list[Tensor]],
) -> list[RemovableHandle]:
    """Hooks that append to ``captured`` what each probe site sees at every call."""

    def hook(key: ProbeSite):
        def on_output(_module: nn.Module, _inputs: tuple, output: object) -> None:
            captured.setdefault(key, []).append(_first_tensor(output))

        def on_input(_module: nn.Module, args: tuple) -> None:
            captured.setdefault(key, []).append(_first_tensor(args))

        return on_input if key[1] else on_output

    return [
        modules[m].register_forward_pre_hook(hook((m, True)))
        if is_input
        else modules[m].register_forward_hook(hook((m, False)))
        for m, is_input in wanted
    ]


def _accumulate(
    stats: dict[str, CrossStatistics],
    wanted: dict[ProbeSite, list[tuple[str, int]]],
    acts_a: dict[ProbeSite, list[Tensor]],
    acts_b: dict[ProbeSite, list[Tensor]],
) -> None:
    """Add one batch's features of both models to each space's running sums."""
    for key, targets in wanted.items():
        for space_name, axis in targets:
            fa = torch.cat([_features(t, axis) for t in acts_a[key]])
            fb = torch.cat([_features(t, axis) for t in acts_b[key]])
            if space_name not in stats:
                stats[space_name] = CrossStatistics.zeros(
                    fa.shape[1], fb.shape[1], device=fa.device
                )
            stats[space_name].update(fa, fb)


def _sum_over_ranks(stats: dict[str, CrossStatistics]) -> None:
    """Replace each process's sums by the sums over all processes (one collective)."""
    processes = world()[1]
    if any_rank(not stats):  # all processes raise together, none waits forever
        raise ValueError(
            f"activation statistics over {processes} processes need at least {processes} "
            "input batches (one per process)"
        )
    fields = ("sum_a", "sum_b", "sum_aa", "sum_bb", "sum_ab")
    parts = []
    for st in stats.values():
        parts.append(torch.tensor([float(st.count)], dtype=torch.float64))
        parts.extend(getattr(st, f) for f in fields)
    summed = iter(sum_over_ranks(parts))
    for st in stats.values():
        st.count = int(round(float(next(summed))))
        for f in fields:
            setattr(st, f, next(summed))
