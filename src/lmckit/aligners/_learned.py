"""Learned matching: optimise the transform for the loss of the merged model.

Git Re-Basin's straight-through estimator (Ainsworth et al., 2023, Sec. 3.3),
generalised to the groups of a :class:`SymmetrySpec` as in "Generalized linear mode
connectivity for transformers" (Theus et al., 2025): every solved space holds a
continuous matrix ``S`` (``m x n``), initialised from a weight-matching solution. The
forward pass *projects* ``S`` onto the group with the group's solver — the Hungarian
assignment for permutations (also block and head permutations), the polar factor
``U V^T`` of ``S = U Sigma V^T`` for orthogonal maps — and uses the projection ``P``
as its value. Permutations pass the gradient to ``S`` unchanged, ``S + (P - S).detach()``
(straight-through: their projection is piecewise constant); orthogonal maps pass the
polar factor's own gradient (:meth:`lmckit.groups.Group.smooth_projection`), which on a
char-level GPT-2 pair took the barrier 0.478 -> 0.269 where straight-through did not
improve on its start (``docs/experiments/reference_comparison.md``). Optionally,
permutations are relaxed to Sinkhorn soft permutations ``sinkhorn(S / temperature)``
during training and projected to the nearest permutation at the end. Groups whose
readers do not move by the element itself are learned too where the element is a
smooth function of ``S`` (:attr:`lmckit.groups.Group.learned_by_inverse`): the positive
diagonal of ``S`` for the scalings of gated units, ``S`` itself for invertible maps;
their readers are contracted with ``P^{-T}``.

Each step draws ``lambda ~ U(low, high)`` and minimises the training loss of
``(1 - lambda) theta_a + lambda T(theta_b)`` with AdamW on the ``S``; the loss is an
argument (default: cross-entropy of logits against labels or next tokens). The transform
is applied to B *differentiably*: every use of a space is contracted with the dense
matrix (:mod:`lmckit.aligners._dense`; writers, readers and elementwise parameters alike
for self-dual groups, where the reader matrix ``T^{-T}`` equals ``T``). Early stopping watches the
loss of the midpoint ``lambda = 1/2`` with the *hard* transform on a validation split;
the best hard transform seen (including the initial one) is returned.

BatchNorm networks: training steps run the module in train mode (batch statistics:
interpolated running statistics are meaningless), and each validation midpoint has its
running statistics reset on training batches (:func:`lmckit.merging.reset_batchnorm`)
before it is evaluated in eval mode. Networks without BatchNorm run in eval mode
throughout (no dropout), so the objective is deterministic given the batches.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from lmckit.aligners._dense import apply_dense
from lmckit.aligners._learned_objective import (
    Descent,
    Loss,
    midpoint_loss,
    validation_split,
)
from lmckit.aligners._registry import register_aligner
from lmckit.aligners._result import AlignmentResult, SpaceDiagnostics
from lmckit.aligners._weight import GIT_REBASIN, space_objective, weight_matching
from lmckit.aligners._width import GENERALIZED_LMC
from lmckit.data import Dataset, batches
from lmckit.groups._permutation import sinkhorn
from lmckit.runtime._distributed import any_rank
from lmckit.symmetry._params import Params, check_compatible, check_finite
from lmckit.symmetry._spaces import Space
from lmckit.symmetry._transform import SymmetrySpec, Transform
from lmckit.training._task import cross_entropy

__all__ = [
    "LearnedMatchingConfig",
    "Loss",
    "apply_dense",
    "learned_matching",
    "sinkhorn",
    "validation_split",
]

PermutationMode = Literal["straight_through", "sinkhorn"]


@dataclass(frozen=True)
class LearnedMatchingConfig:
    """What to compute.

    Attributes:
        steps: maximum optimisation steps.
        lr: AdamW learning rate on the continuous matrices ``S``.
        weight_decay: AdamW decoupled weight decay on ``S``.
        batch_size: training examples per step.
        lam_low, lam_high: each step's interpolation weight ``lambda ~ U(low, high)``.
        permutations: ``straight_through`` (Hungarian projection in every forward) or
            ``sinkhorn`` (soft permutations while training, Hungarian at the end; head
            and block permutations stay straight-through).
        temperature, sinkhorn_iters: of the Sinkhorn relaxation.
        eval_every: steps between validation evaluations of the hard midpoint.
        patience: stop after this many evaluations without a better validation loss.
        val_fraction: share of the training split held out for validation when the
            dataset has no validation split of its own.
        val_batches: at most this many validation batches per evaluation.
        weight_matching_init: start from weight matching (else from the identity or
            the ``init`` given to :func:`learned_matching`).
        max_seconds: stop after this much wall time (the current transform is
            validated once more); ``None``: no time limit.
    """

    steps: int = 500
    lr: float = 0.01
    weight_decay: float = 0.0
    batch_size: int = 128
    lam_low: float = 0.4
    lam_high: float = 0.6
    permutations: PermutationMode = "straight_through"
    temperature: float = 0.1
    sinkhorn_iters: int = 20
    eval_every: int = 25
    patience: int = 8
    val_fraction: float = 0.1
    val_batches: int = 10
    weight_matching_init: bool = True
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.eval_every < 1 or self.patience < 1:
            raise ValueError(f"invalid learned matching config {self}")
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(f"lr must be > 0 and weight_decay >= 0 in {self}")
        if not 0.0 <= self.lam_low <= self.lam_high <= 1.0:
            raise ValueError(
                f"need 0 <= lam_low <= lam_high <= 1, got {self.lam_low}, {self.lam_high}"
            )
        if self.permutations not in ("straight_through", "sinkhorn"):
            raise ValueError(
                f"permutations must be 'straight_through' or 'sinkhorn', got {self.permutations!r}"
            )
        if self.temperature <= 0 or self.sinkhorn_iters < 1:
            raise ValueError("Sinkhorn needs temperature > 0 and at least one iteration")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds must be positive or None, got {self.max_seconds}")
        if not 0.0 < self.val_fraction < 1.0 or self.val_batches < 1:
            raise ValueError(f"val_fraction must lie in (0, 1) and val_batches >= 1 in {self}")


@register_aligner(
    "learned_matching",
    paper=GIT_REBASIN + " (Sec. 3.3); " + GENERALIZED_LMC,
    config=LearnedMatchingConfig,
    needs_model=True,
    needs_data=True,
    options=("steps", "lr", "batch_size", "max_seconds"),
)
def learned_matching(
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    config: LearnedMatchingConfig | None = None,
    *,
    model: nn.Module | None = None,
    data: Dataset | None = None,
    seed: int = 0,
    progress: bool = False,
    device: str | torch.device | None = None,
    init: Transform | None = None,
    spaces: Sequence[str] | None = None,
    row_masks: Mapping[str, Tensor] | None = None,
    loss: Loss = cross_entropy,
) -> AlignmentResult:
    """Learned matching: learn the transform for the loss of the merged model.

    Args:
        spec: the spec of ``model``; learned spaces need a group whose readers move by
            the element itself (:attr:`lmckit.groups.Group.self_dual`: permutations,
            head and padded permutations, orthogonal maps) or by its inverse transpose
            (:attr:`~lmckit.groups.Group.learned_by_inverse`: scalings, invertible
            maps), at equal widths.
        params_a, params_b: reference and model to align; unchanged.
        config: steps, optimiser, lambda range, relaxation, early stopping.
        model: the module both parameter sets run through (required; not moved: a
            copy runs on ``device``).
        data: training split for the steps; validation split (or a held-out slice of
            training) for early stopping (required).
        seed: batch order, lambda draws and weight matching's sweep order.
        progress: progress bar over steps.
        device: where the forward and backward passes run (default CPU). The
            projections onto the groups run on the CPU either way; the inputs and the
            returned transform stay on the CPU.
        init: starting transform; with ``config.weight_matching_init`` weight matching
            starts from it (default identity).
        spaces: learn only these spaces (the others stay at the start transform);
            default: every space whose group learned matching can learn (see ``spec``),
            the others solved by weight matching.
        row_masks: passed to the weight-matching initialisation (rows left out of its
            similarities, e.g. embedding rows of tokens never seen in training).
        loss: ``loss(outputs, targets)`` minimised at the interpolated model and
            watched on validation (default :func:`cross_entropy`), e.g.
            ``torch.nn.functional.mse_loss`` for regression.

    Returns:
        An :class:`AlignmentResult` with the best hard transform on validation;
        ``history`` holds the validation midpoint losses, ``iterations`` the steps run.
    """
    config = config or LearnedMatchingConfig()
    if model is None or data is None:
        raise ValueError("learned matching needs model=... and data=...")
    check_compatible(params_a, params_b)
    check_finite(params_a, what="first model")
    check_finite(params_b, what="second model")
    spec.validate(params_b)
    names = _spaces_to_learn(spec, spaces)
    start = time.perf_counter()
    device = torch.device(device or "cpu")
    base = _start(spec, params_a, params_b, names, config, init, spaces, seed, row_masks)
    fixed = _fixed_part(spec, base, names)
    # buffers outside ``params`` (masks, say) must be on the device too
    if device.type != "cpu":
        model = copy.deepcopy(model).to(device)
    descent = Descent(spec, model, params_a, params_b, base, fixed, names, config, device, loss)
    (train_x, train_y), val = validation_split(data, config.val_fraction)
    if not len(train_x):
        raise ValueError("learned matching needs training examples, the training split is empty")
    generator = torch.Generator().manual_seed(seed)

    def midpoint(transform: Transform) -> float:
        return midpoint_loss(
            model, spec, params_a, params_b, transform, val, train_x,
            batch_size=config.batch_size, max_batches=config.val_batches, device=device,
            loss=loss,
        )  # fmt: skip

    stream = _batch_stream(train_x, train_y, config.batch_size, generator)
    bar = tqdm(total=config.steps, desc="learned matching", disable=not progress, leave=False)
    was_training = model.training
    model.train(descent.batchnorm)
    try:
        run = _descend(descent, midpoint, base, stream, generator, config, start, bar)
    finally:
        bar.close()
        model.train(was_training)
    return AlignmentResult(
        transform=run.best,
        spaces=_diagnostics(spec, names, params_a, params_b, run.best),
        iterations=run.steps,
        iteration_unit="steps",
        converged=run.stale >= config.patience,
        seconds=time.perf_counter() - start,
        history=run.history,
    )


@dataclass
class _Run:
    """Where the descent stands: the best hard transform on validation and its loss,
    the validation losses so far, steps run, evaluations without improvement."""

    best: Transform
    best_loss: float
    history: list[float]
    steps: int = 0
    stale: int = 0

    def evaluated(self, candidate: Transform, value: float) -> None:
        self.history.append(value)
        if value < self.best_loss:
            self.best, self.best_loss, self.stale = candidate, value, 0
        else:
            self.stale += 1


def _descend(
    descent: Descent,
    midpoint: Callable[[Transform], float],
    base: Transform,
    stream: Iterator[tuple[Tensor, Tensor]],
    generator: torch.Generator,
    config: LearnedMatchingConfig,
    start: float,
    bar: tqdm,
) -> _Run:
    """The steps, each on a batch at a random lambda, the hard transform's validation
    midpoint watched every ``eval_every`` steps until patience or time runs out."""
    first = midpoint(base)
    run = _Run(best=base, best_loss=first, history=[first])
    while run.steps < config.steps and run.stale < config.patience:
        xb, yb = next(stream)
        value = descent.step(xb, yb, _draw_lambda(config, generator))
        if not math.isfinite(value):
            raise FloatingPointError(f"learned matching diverged at step {run.steps}")
        run.steps += 1
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4f}", best=f"{run.best_loss:.4f}")
        out_of_time = config.max_seconds is not None and any_rank(
            time.perf_counter() - start > config.max_seconds
        )
        if run.steps % config.eval_every == 0 or run.steps == config.steps or out_of_time:
            candidate = descent.hard_transform()
            run.evaluated(candidate, midpoint(candidate))
        if out_of_time:
            break
    return run


def _start(
    spec: SymmetrySpec,
    params_a: Params,
    params_b: Params,
    names: Sequence[str],
    config: LearnedMatchingConfig,
    init: Transform | None,
    spaces: Sequence[str] | None,
    seed: int,
    row_masks: Mapping[str, Tensor] | None,
) -> Transform:
    """Where learning starts: weight matching's solution (from ``init`` if given, else its
    own anchored start), or ``init`` / the identity."""
    if not config.weight_matching_init:
        return init or Transform.identity(spec)
    solved = None if spaces is None else list(names)
    return weight_matching(
        spec, params_a, params_b, init=init, spaces=solved, seed=seed, row_masks=row_masks
    ).transform


def _batch_stream(
    x: Tensor, y: Tensor, batch_size: int, generator: torch.Generator
) -> Iterator[tuple[Tensor, Tensor]]:
    """Shuffled training batches, epoch after epoch."""
    while True:
        yield from batches(x, y, batch_size, shuffle=True, generator=generator)


def _draw_lambda(config: LearnedMatchingConfig, generator: torch.Generator) -> float:
    """A step's interpolation weight, uniform in ``[lam_low, lam_high]``."""
    return config.lam_low + (config.lam_high - config.lam_low) * float(
        torch.rand((), generator=generator)
    )


def _spaces_to_learn(spec: SymmetrySpec, spaces: Sequence[str] | None) -> list[str]:
    """The spaces given, or every space whose group can be learned (the others, e.g.
    rectangular embeddings, come from weight matching and stay as it left them)."""
    names = [n for n in spec.names if _learnable(spec[n])] if spaces is None else list(spaces)
    if not names:
        raise ValueError("learned matching needs at least one space to learn")
    for name in names:
        if not _learnable(spec[name]):
            raise ValueError(
                f"learned matching cannot learn space {name!r} with group "
                f"{spec[name].group.name} (no differentiable element, readers not moved by "
                "it); pass spaces=... to leave it out"
            )
    return names


def _learnable(space: Space) -> bool:
    """Whether learned matching can hold a continuous matrix for ``space``: self-dual
    groups, and square groups whose readers it moves by the inverse transpose."""
    return space.group.self_dual or space.group.learned_by_inverse


def _fixed_part(spec: SymmetrySpec, base: Transform, names: Sequence[str]) -> Transform:
    """``base`` without the learned spaces: applied once, non-differentiably, to B.

    Spaces not learned are expressed in the input frame of the learned spaces they are
    nested in, so that they stay with the units they act on whatever is learned.
    """
    home = base
    for name in names:
        if any(s.name not in names for s in spec.nested_in(name)):
            undo = Transform(spec, {name: spec[name].group.inverse(base[name])})
            home = undo.compose(home)
    return home.replace(**{n: spec[n].group.identity(spec[n].n) for n in names})


def _diagnostics(
    spec: SymmetrySpec, names: Sequence[str], params_a: Params, params_b: Params, best: Transform
) -> dict[str, SpaceDiagnostics]:
    """Each learned space's weight-matching objective before and after."""
    ref = {k: v.float() for k, v in params_a.items() if v.is_floating_point()}
    other = {k: v.float() for k, v in params_b.items() if v.is_floating_point()}
    identity = Transform.identity(spec)
    return {
        name: SpaceDiagnostics(
            space_objective(spec, spec[name], ref, other, identity),
            space_objective(spec, spec[name], ref, other, best),
        )
        for name in names
    }
