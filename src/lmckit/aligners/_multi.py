"""Universe matching: bring ``K >= 3`` models into one common frame.

Each model ``k`` gets one transform ``T_k`` into a shared "universe" frame; the
objective is the sum of pairwise weight similarities in that frame,
``sum_{j < k} <T_j(theta_j), T_k(theta_k)>``. Block coordinate ascent: model ``k``
is weight-matched (exactly, per space, by its group's solver) to the sum of the
others' current images ``sum_{j != k} T_j(theta_j)`` — with the others fixed, the
objective is linear in ``T_k(theta_k)``, so each step cannot decrease it. Sweeps
repeat until no transform changes (in the spirit of Ainsworth et al., 2023, App. A.9,
"merging many models", and of Crisostomi et al., 2024, "C2M3").

Because every model has a single map into the universe, the pairwise maps
``T_{i->j} = T_j^{-1} T_i`` are cycle-consistent by construction:
``T_{j->k} T_{i->j} = T_{i->k}``. The result is expressed in model 0's frame
(``T_0 = I``): ``T_k <- T_0^{-1} T_k`` for every ``k``.

As an aligner it follows the common signature: ``params_a`` is model 0, ``params_b``
model 1, ``others`` any further models; the result's ``transform`` aligns model 1 to
model 0 and ``transforms`` holds every ``T_k``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from lmckit.aligners._registry import register_aligner
from lmckit.aligners._result import AlignmentResult, SpaceDiagnostics
from lmckit.aligners._weight import (
    GIT_REBASIN,
    WeightMatchingConfig,
    space_objective,
    weight_matching,
)
from lmckit.data import Dataset
from lmckit.symmetry._average import weighted_average
from lmckit.symmetry._params import Params, check_compatible, check_finite
from lmckit.symmetry._transform import SymmetrySpec, Transform, apply

__all__ = ["UniverseConfig", "UniverseResult", "universe_matching"]

C2M3 = (
    "Crisostomi, Fumero, Baieri, Bernard, Rodola, 2024, C2M3: Cycle-Consistent "
    "Multi-Model Merging, https://arxiv.org/abs/2405.17897"
)


@dataclass(frozen=True)
class UniverseConfig:
    """What to compute.

    Attributes:
        max_iter: maximum sweeps over the models.
        inner: weight-matching settings of each model-to-rest step.
    """

    max_iter: int = 50
    inner: WeightMatchingConfig = field(default_factory=WeightMatchingConfig)

    def __post_init__(self) -> None:
        if self.max_iter < 1:
            raise ValueError(f"max_iter must be >= 1, got {self.max_iter}")


@dataclass(frozen=True)
class UniverseResult(AlignmentResult):
    """An :class:`AlignmentResult` (``transform`` aligns model 1 to model 0) plus the
    per-model transforms into one frame, model 0's (``transforms[0]`` is the identity).

    Attributes:
        transforms: ``T_k``; ``apply(spec, models[k], transforms[k])`` is model ``k`` in
            the common frame.
        history: the objective (sum of pairwise inner products in the universe) after
            each sweep.
    """

    transforms: tuple[Transform, ...] = ()

    def pairwise(self, i: int, j: int) -> Transform:
        """``T_j^{-1} T_i``: aligns model ``i`` to model ``j``'s frame."""
        return self.transforms[j].inverse().compose(self.transforms[i])

    def aligned(self, spec: SymmetrySpec, models: Sequence[Params]) -> list[Params]:
        """Every model moved into the common frame."""
        if len(models) != len(self.transforms):
            raise ValueError(f"expected {len(self.transforms)} models, got {len(models)}")
        return [apply(spec, m, t) for m, t in zip(models, self.transforms, strict=True)]


def _pairwise_objective(models: Sequence[Params]) -> float:
    total = 0.0
    for i in range(len(models)):
        for j in range(i + 1, len(models)):
            for name, value in models[i].items():
                if value.is_floating_point():
                    total += float((value.double() * models[j][name].double()).sum())
    return total


def _same(spec: SymmetrySpec, x: Transform, y: Transform) -> bool:
    return all(s.group.close(x[s.name], y[s.name]) for s in spec)


@register_aligner(
    "universe_matching", paper=GIT_REBASIN + " (App. A.9); " + C2M3, config=UniverseConfig
)
def universe_matching(
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    config: UniverseConfig | None = None,
    *,
    model: nn.Module | None = None,
    data: Dataset | None = None,
    seed: int = 0,
    progress: bool = False,
    device: str | torch.device | None = None,
    others: Sequence[Params] = (),
    row_masks: Mapping[str, Tensor] | None = None,
    row_weights: Mapping[str, Tensor] | None = None,
) -> UniverseResult:
    """Universe matching: align ``K >= 2`` models of one architecture into one frame.

    Args:
        spec: symmetry spec of the architecture.
        params_a, params_b: models 0 and 1; unchanged.
        config: sweeps and the inner weight-matching settings.
        model, data: unused (data-free); accepted for the common aligner signature.
        seed: model order per sweep and weight matching's space order.
        progress: progress bar over sweeps.
        device: where weight matching's similarities are computed (default CPU).
        others: models 2, 3, ... (same shapes, so every element is square and
            invertible); unchanged.
        row_masks: rows left out of every similarity, as in :func:`weight_matching`
            (e.g. embedding rows of tokens absent from the training data).
        row_weights: rows weighted in every similarity, as in :func:`weight_matching`.
    """
    config = config or UniverseConfig()
    models = [params_a, params_b, *others]
    for k, params in enumerate(models):
        check_compatible(models[0], params)
        spec.validate(params)
        check_finite(params, what=f"model {k}")
    start = time.perf_counter()
    floats = [
        {n: v.detach().float() for n, v in m.items() if v.is_floating_point()} for m in models
    ]
    transforms = [Transform.identity(spec) for _ in models]
    images = list(floats)
    generator = torch.Generator().manual_seed(seed)
    history: list[float] = []
    converged = False
    sweeps = 0
    bar = tqdm(desc="universe matching", unit="sweep", disable=not progress, leave=False)
    try:
        for _ in range(config.max_iter):
            sweeps += 1
            changed = _sweep(spec, floats, images, transforms, config, generator, device,
                             row_masks, row_weights)  # fmt: skip
            history.append(_pairwise_objective(images))
            bar.update(1)
            if not changed:
                converged = True
                break
    finally:
        bar.close()
    # gauge: express the universe in model 0's frame
    to_first = transforms[0].inverse()
    transforms = [to_first.compose(t) for t in transforms]
    return UniverseResult(
        transform=transforms[1],
        spaces=_pair_diagnostics(spec, floats[0], floats[1], transforms[1]),
        iterations=sweeps,
        converged=converged,
        seconds=time.perf_counter() - start,
        history=history,
        transforms=tuple(transforms),
    )


def _sweep(
    spec: SymmetrySpec,
    floats: Sequence[Params],
    images: list[Params],
    transforms: list[Transform],
    config: UniverseConfig,
    generator: torch.Generator,
    device: str | torch.device | None,
    row_masks: Mapping[str, Tensor] | None,
    row_weights: Mapping[str, Tensor] | None,
) -> bool:
    """Match every model, in random order, to the sum of the others' images; update
    ``transforms`` and ``images`` in place. Whether any transform changed."""
    changed = False
    for k in torch.randperm(len(floats), generator=generator).tolist():
        rest = [images[j] for j in range(len(floats)) if j != k]
        # the sum of the others' images: maximising <T_k theta_k, sum> is the exact
        # coordinate step of the pairwise objective
        target = weighted_average(rest, [1.0] * len(rest))
        result = weight_matching(
            spec,
            target,
            floats[k],
            config.inner,
            init=transforms[k],
            seed=int(torch.randint(0, 2**31 - 1, (), generator=generator)),
            device=device,
            row_masks=row_masks,
            row_weights=row_weights,
        )
        if not _same(spec, result.transform, transforms[k]):
            changed = True
            transforms[k] = result.transform
            images[k] = apply(spec, floats[k], transforms[k])
    return changed


def _pair_diagnostics(
    spec: SymmetrySpec, first: Params, second: Params, transform: Transform
) -> dict[str, SpaceDiagnostics]:
    """Each space's weight-matching objective between models 0 and 1, before and after."""
    identity = Transform.identity(spec)
    return {
        s.name: SpaceDiagnostics(
            space_objective(spec, s, first, second, identity),
            space_objective(spec, s, first, second, transform),
        )
        for s in spec
    }
