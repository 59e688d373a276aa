"""Activation matching (Ainsworth et al., 2023, Sec. 3.1; Li et al., 2015).

For each space, the two models' activations at the space's probes are compared unit
by unit: the cross-correlation (or cross-covariance) ``C[i, j]`` between unit ``i``
of the reference model and unit ``j`` of the other is accumulated batch by batch
from running sums (:mod:`lmckit.aligners._cross_statistics`), so activations are never
all held in memory. Each space is then solved independently by its group's solver
(assignment for permutations, Procrustes on the cross-covariance for orthogonal maps).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from lmckit.aligners._cross_statistics import collect_cross_statistics
from lmckit.aligners._registry import register_aligner
from lmckit.aligners._result import AlignmentResult, SpaceDiagnostics
from lmckit.aligners._weight import GIT_REBASIN, WeightMatchingConfig, weight_matching
from lmckit.data import Dataset, batches
from lmckit.symmetry._params import Params, check_compatible, check_finite
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform

__all__ = ["ActivationMatchingConfig", "activation_matching"]

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
