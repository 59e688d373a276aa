"""What matched neurons compute: activation-matching objectives and chord deviation.

Functional diagnostics of neuron identifiability (Boehm et al., "Beyond structural
symmetries"): how far the identity pairing of two models' units is from the optimal
permutation of their activation correlations (:func:`activation_matching_objectives`),
and how far a layer bends along the linear path between two parameter sets
(:func:`chord_deviation`, eq. 30). The geometric diagnostics (subspaces, realization and
swap costs) are in :mod:`lmckit.diagnostics._identifiability`, which re-exports these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.aligners._cross_statistics import collect_cross_statistics
from lmckit.aligners._solvers import solve
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params, check_compatible
from lmckit.symmetry._transform import Permutation, SymmetrySpec

__all__ = [
    "MatchingObjective",
    "activation_matching_objectives",
    "chord_deviation",
    "collect_layer_inputs",
    "matching_objective",
    "overall_objective",
]


def collect_layer_inputs(
    model: nn.Module, params: Params, inputs: Iterable[Tensor], layer: str
) -> Tensor:
    """Inputs seen by module ``layer`` when ``inputs`` run through the model: ``(N, d)``.

    All leading axes are flattened into samples (the layer's last axis is its input
    feature axis: ``d = in_features``).
    """
    module = model.get_submodule(layer)
    seen: list[Tensor] = []
    handle = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for x in inputs:
                functional_call(model, dict(params), (x,))
    finally:
        handle.remove()
        model.train(was_training)
    if not seen:
        raise ValueError("no input batches were given")
    return torch.cat([s.reshape(-1, s.shape[-1]) for s in seen])


# --------------------------------------------------------------------------- matching objective


@dataclass(frozen=True)
class MatchingObjective:
    """Activation-matching objective ``⟨P, C⟩ / n`` of one space.

    ``C[i, j]``: Pearson correlation between unit ``i`` of model A and unit ``j`` of
    model B; ``⟨P, C⟩ = Σ_i C[i, π(i)]`` for the permutation ``π`` of ``P``. Values are
    divided by ``n`` (a mean correlation in ``[-1, 1]``).

    Attributes:
        identity: ``⟨I, C⟩ / n``.
        optimal: ``max_P ⟨P, C⟩ / n`` (linear assignment).
        random_mean, random_std: over ``random`` uniform permutations.
        n: units.
        random: how many random permutations were drawn.
    """

    identity: float
    optimal: float
    random_mean: float
    random_std: float
    n: int
    random: int

    @property
    def identity_gap(self) -> float:
        """``(optimal - identity) / (optimal - random_mean)``: 0 = identity optimal."""
        span = self.optimal - self.random_mean
        return (self.optimal - self.identity) / span if span > 0 else 0.0


def matching_objective(
    corr: Tensor, *, random: int = 100, generator: torch.Generator | None = None
) -> MatchingObjective:
    """Objective of the identity, optimal and ``random`` random permutations on ``corr``.

    ``corr``: ``(n, n)`` cross-correlation, rows model A, columns model B.
    """
    if corr.ndim != 2 or corr.shape[0] != corr.shape[1]:
        raise ValueError(f"corr must be square (n, n), got {tuple(corr.shape)}")
    if random < 1:
        raise ValueError(f"need at least one random permutation, got {random}")
    n = corr.shape[0]
    c = corr.double()
    perm = solve(Permutation(), c.float())  # maps row i to column perm[i]
    optimal = float(c[torch.arange(n), perm].sum()) / n
    gen = generator or torch.Generator().manual_seed(0)
    rand = torch.stack(
        [c[torch.arange(n), torch.randperm(n, generator=gen)].sum() / n for _ in range(random)]
    )
    return MatchingObjective(
        identity=float(c.diagonal().sum()) / n,
        optimal=optimal,
        random_mean=float(rand.mean()),
        random_std=float(rand.std()) if random > 1 else 0.0,
        n=n,
        random=random,
    )


def activation_matching_objectives(
    model: nn.Module,
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    inputs: Iterable[Tensor],
    *,
    random: int = 100,
    seed: int = 0,
    spaces: Sequence[str] | None = None,
) -> dict[str, MatchingObjective]:
    """Per-space :class:`MatchingObjective` of B against A at the spec's probes."""
    check_compatible(params_a, params_b)
    stats = collect_cross_statistics(model, spec, params_a, params_b, inputs, spaces=spaces)
    gen = torch.Generator().manual_seed(seed)
    return {
        name: matching_objective(st.correlation(), random=random, generator=gen)
        for name, st in stats.items()
    }


def overall_objective(objectives: Mapping[str, MatchingObjective]) -> MatchingObjective:
    """Mean over spaces (the paper's "all layers" figure); std is the mean of stds."""
    if not objectives:
        raise ValueError("no objectives to average")
    vals = list(objectives.values())

    def mean(attr: str) -> float:
        return sum(getattr(v, attr) for v in vals) / len(vals)

    return MatchingObjective(
        identity=mean("identity"),
        optimal=mean("optimal"),
        random_mean=mean("random_mean"),
        random_std=mean("random_std"),
        n=sum(v.n for v in vals),
        random=min(v.random for v in vals),
    )


# --------------------------------------------------------------------------- chord deviation


def chord_deviation(
    layer: nn.Module,
    params_a: Params,
    params_b: Params,
    x: Tensor,
    *,
    ts: Sequence[float] = (0.25, 0.5, 0.75),
) -> list[float]:
    """Chord deviation of a layer along the linear path (eq. 30), one value per ``t``.

    ``δ(t) = E_x || f_{θ(t)}(x) - ((1 - t) f_{θ_a}(x) + t f_{θ_b}(x)) ||²`` with
    ``θ(t) = (1 - t) θ_a + t θ_b`` and the layer's input ``x`` (``(N, ...)``) held
    fixed; the norm is over all non-batch axes. Zero for a layer linear in its
    parameters; for ReLU layers it comes from gates that flip along the path.
    """
    check_compatible(params_a, params_b)
    if any(not 0 <= t <= 1 for t in ts):
        raise ValueError(f"ts must lie in [0, 1], got {list(ts)}")
    was_training = layer.training
    layer.eval()
    try:
        with torch.no_grad():
            fa = functional_call(layer, dict(params_a), (x,))
            fb = functional_call(layer, dict(params_b), (x,))
            out = []
            for t in ts:
                ft = functional_call(layer, interpolate(params_a, params_b, t), (x,))
                dev = (ft - ((1 - t) * fa + t * fb)).flatten(1)
                out.append(float((dev * dev).sum(1).mean()))
    finally:
        layer.train(was_training)
    return out
