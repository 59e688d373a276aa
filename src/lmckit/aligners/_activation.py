"""Activation matching (Ainsworth et al., 2023, Sec. 3.1; Li et al., 2015).

For each space, the two models' activations at the space's probes are compared unit
by unit: the cross-correlation (or cross-covariance) ``C[i, j]`` between unit ``i``
of the reference model and unit ``j`` of the other is accumulated batch by batch
from running sums, so activations are never all held in memory. Each space is then
solved independently by its group's solver (assignment for permutations,
Procrustes on the cross-covariance for orthogonal maps).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call
from tqdm.auto import tqdm

from lmckit.aligners._registry import register_aligner
from lmckit.aligners._result import AlignmentResult, SpaceDiagnostics
from lmckit.aligners._weight import GIT_REBASIN, WeightMatchingConfig, weight_matching
from lmckit.data import Dataset, batches
from lmckit.runtime._distributed import any_rank, is_distributed, shard, sum_over_ranks, world
from lmckit.symmetry._params import Params, check_compatible, check_finite
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform

__all__ = [
    "ActivationMatchingConfig",
    "CrossStatistics",
    "activation_matching",
    "collect_cross_statistics",
]

Statistic = Literal["correlation", "covariance", "natural"]
_STATISTICS = ("correlation", "covariance", "natural")


@dataclass(frozen=True)
class ActivationMatchingConfig:
    """What to compute.

    Attributes:
        statistic: ``"correlation"`` (Pearson; the default, for permutations),
            ``"covariance"`` (what Procrustes wants for orthogonal maps), or
            ``"natural"``: each group's own choice
            (:attr:`lmckit.groups.Group.natural_statistic`).
        batch_size: training examples per batch streamed through both models (when
            ``data`` is a :class:`~lmckit.data.Dataset`; given batches are used as they are).
        batches: how many training batches (the first ones, in order) are used (likewise).
    """

    statistic: Statistic = "correlation"
    batch_size: int = 500
    batches: int = 20

    def __post_init__(self) -> None:
        if self.statistic not in _STATISTICS:
            raise ValueError(
                f"statistic must be 'correlation', 'covariance' or 'natural', got "
                f"{self.statistic!r}"
            )
        if self.batch_size < 1 or self.batches < 1:
            raise ValueError(f"batch_size and batches must be >= 1 in {self}")


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
    names = list(spec.names if spaces is None else spaces)
    wanted: dict[tuple[str, bool], list[tuple[str, int]]] = {}
    for name in names:
        space = spec[name]
        if not space.probes:
            raise ValueError(f"space {name!r} has no probes: activation matching cannot see it")
        for probe in space.probes:
            wanted.setdefault((probe.module, probe.input), []).append((name, probe.axis))
    # forward passes need built tensors: a model computed when read (folded norm scales,
    # lmckit.inference._fold) is built once here, not at every batch
    params_a = params_a if isinstance(params_a, dict) else dict(params_a)
    params_b = params_b if isinstance(params_b, dict) else dict(params_b)
    dev = torch.device(device or "cpu")
    if dev.type != "cpu":
        model = copy.deepcopy(model).to(dev)
        params_a = {k: v.to(dev) for k, v in params_a.items()}
        params_b = {k: v.to(dev) for k, v in params_b.items()}
    modules = dict(model.named_modules())
    missing = [m for m, _ in wanted if m not in modules]
    if missing:
        raise ValueError(f"probe modules not in the model: {missing}")

    # every call of a probed module (a layer whose weights serve several layers, as
    # ALBERT's): the same element must serve all of them, so their samples are pooled
    captured: dict[tuple[str, bool], list[Tensor]] = {}

    def hook(key: tuple[str, bool]):
        def on_output(_module: nn.Module, _inputs: tuple, output: object) -> None:
            captured.setdefault(key, []).append(_first_tensor(output))

        def on_input(_module: nn.Module, args: tuple) -> None:
            captured.setdefault(key, []).append(_first_tensor(args))

        return on_input if key[1] else on_output

    handles = [
        modules[m].register_forward_pre_hook(hook((m, True)))
        if is_input
        else modules[m].register_forward_hook(hook((m, False)))
        for m, is_input in wanted
    ]
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
                for key, targets in wanted.items():
                    for space_name, axis in targets:
                        fa = torch.cat([_features(t, axis) for t in acts_a[key]])
                        fb = torch.cat([_features(t, axis) for t in captured[key]])
                        if space_name not in stats:
                            stats[space_name] = CrossStatistics.zeros(
                                fa.shape[1], fb.shape[1], device=fa.device
                            )
                        stats[space_name].update(fa, fb)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if is_distributed():
        _sum_over_ranks(stats)
    if not stats:
        raise ValueError("no input batches were given")
    return stats


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


def _unit_similarity(sim: Tensor, space: Space, *, within: bool = False) -> Tensor:
    """The ``(n, n)`` similarity the space's solver reads, from the features a probe sees.

    Units that probes see as blocks of ``k`` features each (grouped-query heads: a key
    head's block of query-head features) are compared by the diagonal of every
    ``k x k`` block pair, summed: features matched in place within a unit. With
    ``within`` (spaces nested in the units move features inside each block), by each
    block pair's nuclear norm instead: its best match under any orthogonal map of the
    block, the same whatever basis each model's unit has.
    """
    n, group = space.n, space.group
    units = group.units(n) if within else None
    if units is not None and sim.shape[0] % units == 0 and sim.shape[0] // units > 1:
        k = sim.shape[0] // units
        blocks = sim.reshape(units, k, units, k).permute(0, 2, 1, 3).double()
        return group.spread(torch.linalg.matrix_norm(blocks, ord="nuc").float())
    if sim.shape[0] == n:
        return sim
    k = sim.shape[0] // n
    if k * n != sim.shape[0] or sim.shape[0] != sim.shape[1]:
        raise ValueError(f"a probe sees {tuple(sim.shape)} features for a space of {n} units")
    return torch.diagonal(sim.reshape(n, k, n, k), dim1=1, dim2=3).sum(-1)


def _input_batches(
    data: Dataset | Iterable[Tensor], config: ActivationMatchingConfig
) -> Iterable[Tensor]:
    """The input batches ``data`` stands for: the first training batches of a
    :class:`Dataset`, or the given batches as they are."""
    if isinstance(data, Dataset):
        return (
            x
            for x, _ in batches(data.x_train, data.y_train, config.batch_size, limit=config.batches)
        )
    if isinstance(data, Tensor):
        # iterating a tensor would yield its rows, each taken for a batch
        raise ValueError(
            "activation matching needs a Dataset or an iterable of input batches as data, "
            "not one tensor (pass [inputs])"
        )
    return data


@register_aligner(
    "activation_matching",
    paper=GIT_REBASIN + " (Sec. 3.1); Li et al., 2015, Convergent Learning, "
    "https://arxiv.org/abs/1511.07543",
    config=ActivationMatchingConfig,
    needs_model=True,
    needs_data=True,
)
def activation_matching(
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    config: ActivationMatchingConfig | None = None,
    *,
    model: nn.Module | None = None,
    data: Dataset | Iterable[Tensor] | None = None,
    seed: int = 0,
    progress: bool = False,
    device: str | torch.device | None = None,
    spaces: Sequence[str] | None = None,
) -> AlignmentResult:
    """Activation matching: align ``params_b`` to ``params_a`` by their activations.

    Args:
        spec: the spec of ``model`` (every solved space needs probes).
        params_a, params_b: reference and model to align; unchanged.
        config: statistic and how much training data to stream.
        model: the module both parameter sets run through (required).
        data: a :class:`Dataset`, whose first ``config.batches`` training batches of
            ``config.batch_size`` are streamed, or an iterable of input batches
            (tensors ``(batch, ...)`` that ``model`` takes), streamed as given
            (``config.batch_size`` and ``config.batches`` then do not apply). Required.
        seed: unused (the batches are the first ones, in order).
        progress: progress bar over batches.
        device: where the passes and statistics run (default CPU).
        spaces: solve only these spaces; default all. Spaces nested in others (inside
            heads) have no probes: they are solved by weight matching once the spaces
            around them are matched by activations.
    """
    config = config or ActivationMatchingConfig()
    if model is None or data is None:
        raise ValueError("activation matching needs model=... and data=...")
    check_compatible(params_a, params_b)
    check_finite(params_a, what="first model")
    check_finite(params_b, what="second model")
    spec.validate(params_b)
    requested = list(spec.names if spaces is None else spaces)
    # spaces nested inside heads or units (value and query/key bases, query heads of a
    # group) are not seen by any probe of their own: they are solved from the weights,
    # given what the activations decided for the spaces around them
    nested = [name for name in requested if spec[name].enclosed]
    probed = [name for name in requested if not spec[name].enclosed]
    for name in probed:
        if spec[name].group.least_squares:
            raise ValueError(
                f"activation matching cannot solve space {name!r}: {spec[name].group.name} "
                "is fitted by least squares; pass spaces=... to leave it out"
            )
    inputs = _input_batches(data, config)
    start = time.perf_counter()
    stats = collect_cross_statistics(
        model, spec, params_a, params_b, inputs, spaces=probed, progress=progress, device=device
    )
    elements = {}
    diagnostics = {}
    for name, st in stats.items():
        group = spec[name].group
        chosen = group.natural_statistic if config.statistic == "natural" else config.statistic
        sim = (st.correlation() if chosen == "correlation" else st.covariance()).float().cpu()
        sim = _unit_similarity(sim, spec[name], within=bool(spec.nested_in(name)))
        element = group.solve(sim)
        elements[name] = element
        diagnostics[name] = SpaceDiagnostics(
            group.objective(group.identity(spec[name].n), sim), group.objective(element, sim)
        )
    transform = Transform(spec, elements)
    if nested:
        inside = weight_matching(
            spec,
            params_a,
            params_b,
            WeightMatchingConfig(start="identity"),
            init=transform,
            spaces=nested,
            seed=seed,
        )
        transform, diagnostics = inside.transform, {**diagnostics, **inside.spaces}
    return AlignmentResult(
        transform=transform,
        spaces=diagnostics,
        seconds=time.perf_counter() - start,
    )
