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
during training and projected to the nearest permutation at the end.

Each step draws ``lambda ~ U(low, high)`` and minimises the training loss of
``(1 - lambda) theta_a + lambda T(theta_b)`` with AdamW on the ``S``; the loss is an
argument (default: cross-entropy of logits against labels or next tokens). The transform
is applied to B *differentiably*: every use of a space is contracted with the dense
matrix (:mod:`lmckit.aligners.dense`; writers, readers and elementwise parameters alike:
for the groups it accepts the reader matrix ``T^{-T}`` equals ``T``). Early stopping watches the
loss of the midpoint ``lambda = 1/2`` with the *hard* transform on a validation split;
the best hard transform seen (including the initial one) is returned.

BatchNorm networks: training steps run the module in train mode (batch statistics:
interpolated running statistics are meaningless), and each validation midpoint has its
running statistics reset on training batches (:func:`lmckit.merge.reset_batchnorm`)
before it is evaluated in eval mode. Networks without BatchNorm run in eval mode
throughout (no dropout), so the objective is deterministic given the batches.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call
from tqdm.auto import tqdm

from lmckit.aligners.dense import apply_dense, straight_through
from lmckit.aligners.registry import register_aligner
from lmckit.aligners.result import AlignmentResult, SpaceDiagnostics
from lmckit.aligners.weight import GIT_REBASIN, space_objective, weight_matching
from lmckit.aligners.width import GENERALIZED_LMC
from lmckit.data import Dataset, batches
from lmckit.distributed import any_rank, rank_rows, shard, sum_gradients, sum_over_ranks
from lmckit.groups import sinkhorn
from lmckit.merge import has_batchnorm, reset_batchnorm
from lmckit.params import Params, check_compatible, check_finite, interpolate
from lmckit.symmetry import SymmetrySpec, Transform, apply
from lmckit.task import cross_entropy

__all__ = [
    "LearnedMatchingConfig",
    "Loss",
    "apply_dense",
    "learned_matching",
    "sinkhorn",
    "validation_split",
]

PermutationMode = Literal["straight_through", "sinkhorn"]
#: ``loss(outputs, targets)``: a scalar to minimise, differentiable in ``outputs``.
Loss = Callable[[Tensor, Tensor], Tensor]


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


def validation_split(
    data: Dataset, fraction: float
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """``((x_train, y_train), (x_val, y_val))`` for early stopping.

    Uses the dataset's own validation split where it has one; otherwise the last
    ``fraction`` of the training split is held out (and not trained on).
    """
    if data.x_val is not None and data.y_val is not None and len(data.x_val) > 0:
        return (data.x_train, data.y_train), (data.x_val, data.y_val)
    n = data.x_train.shape[0]
    held = max(1, int(round(fraction * n)))
    if held >= n:
        raise ValueError(f"cannot hold out {held} of {n} training examples for validation")
    cut = n - held
    return (data.x_train[:cut], data.y_train[:cut]), (data.x_train[cut:], data.y_train[cut:])


# --------------------------------------------------------------------------- learning


def _midpoint_loss(
    model: nn.Module,
    spec: SymmetrySpec,
    a: Params,
    b: Params,
    transform: Transform,
    val: tuple[Tensor, Tensor],
    train_x: Tensor,
    config: LearnedMatchingConfig,
    device: torch.device,
    loss: Loss,
) -> float:
    # the transform's elements live on the CPU (the solvers' side): apply there, then move
    mid = _to(interpolate(a, apply(spec, b, transform), 0.5), device)
    if has_batchnorm(model):
        stop = min(train_x.shape[0], 20 * config.batch_size)
        inputs = [
            train_x[i : i + config.batch_size].to(device) for i in range(0, stop, config.batch_size)
        ]
        mid = reset_batchnorm(model, mid, inputs)
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            # training-sized batches: a language model's logits are (batch, time, vocab)
            for x, y in shard(batches(val[0], val[1], config.batch_size, limit=config.val_batches)):
                x, y = x.to(device), y.to(device)
                total += float(loss(functional_call(model, mid, (x,)), y)) * len(x)
                count += len(x)
    finally:
        model.train(was_training)
    (sums,) = sum_over_ranks([torch.tensor([total, count], dtype=torch.float64)])
    return float(sums[0]) / float(sums[1])


def _to(params: Params, device: torch.device) -> Params:
    return {k: v.to(device) for k, v in params.items()}


@register_aligner(
    "learned_matching",
    paper=GIT_REBASIN + " (Sec. 3.3); " + GENERALIZED_LMC,
    config=LearnedMatchingConfig,
    needs_model=True,
    needs_data=True,
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
        spec: the spec of ``model``; solved spaces need a group whose readers move by
            the element itself (:attr:`lmckit.groups.Group.self_dual`: permutations,
            head and padded permutations, orthogonal maps), at equal widths.
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
            default: every space whose group learned matching can learn
            (:attr:`~lmckit.groups.Group.self_dual`), the others solved by weight matching.
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
    # by default every space whose group can be learned (the others, e.g. scalings of
    # gated units, come from weight matching and stay as it left them)
    names = list([n for n in spec.names if spec[n].group.self_dual] if spaces is None else spaces)
    if not names:
        raise ValueError("learned matching needs at least one space to learn")
    for name in names:
        group = spec[name].group
        if not group.self_dual:
            raise ValueError(
                f"learned matching cannot learn space {name!r} with group {group.name} "
                "(its readers do not move by the element itself); pass spaces=... to "
                "leave it out"
            )
    start = time.perf_counter()
    device = torch.device(device or "cpu")
    if config.weight_matching_init:
        # without ``init`` weight matching takes its own (anchored) start
        solved = None if spaces is None else names
        base = weight_matching(
            spec, params_a, params_b, init=init, spaces=solved, seed=seed, row_masks=row_masks
        ).transform
    else:
        base = init or Transform.identity(spec)
    a = {k: v.detach().to(device) for k, v in params_a.items()}
    # the spaces not learned are applied once, non-differentiably, in the input frame of
    # the learned spaces they are nested in: they stay with the units they act on
    home = base
    for name in names:
        if any(s.name not in names for s in spec.nested_in(name)):
            undo = Transform(spec, {name: spec[name].group.inverse(base[name])})
            home = undo.compose(home)
    fixed = home.replace(**{n: spec[n].group.identity(spec[n].n) for n in names})
    b = _to(apply(spec, {k: v.detach() for k, v in params_b.items()}, fixed), device)
    conts = {
        n: torch.nn.Parameter(spec[n].group.matrix(base[n]).float().to(device, copy=True))
        for n in names
    }
    opt = torch.optim.AdamW(conts.values(), lr=config.lr, weight_decay=config.weight_decay)
    (train_x, train_y), val = validation_split(data, config.val_fraction)
    generator = torch.Generator().manual_seed(seed)
    buffers = {k for k, _ in model.named_buffers()}
    batchnorm = has_batchnorm(model)
    # buffers outside ``params`` (masks, say) must be on the device too
    if device.type != "cpu":
        model = copy.deepcopy(model).to(device)
    relax = config.permutations == "sinkhorn"

    def hard_transform() -> Transform:
        learned = {n: spec[n].group.project(conts[n].detach().cpu()) for n in names}
        return Transform(spec, learned).compose(fixed)

    def midpoint(transform: Transform) -> float:
        return _midpoint_loss(
            model, spec, params_a, params_b, transform, val, train_x, config, device, loss
        )

    best = base
    best_loss = midpoint(best)
    history = [best_loss]
    stale = 0
    step = 0
    bar = tqdm(total=config.steps, desc="learned matching", disable=not progress, leave=False)
    was_training = model.training
    model.train(batchnorm)
    try:
        out_of_time = False
        while step < config.steps and stale < config.patience:
            for xb, yb in batches(
                train_x, train_y, config.batch_size, shuffle=True, generator=generator
            ):
                # processes take their rows and sum gradients; with BatchNorm (whole-batch
                # statistics) each runs the whole batch and the gradients are averaged
                share = slice(None) if batchnorm else rank_rows(len(xb))
                xs, ys = xb[share].to(device), yb[share].to(device)
                lam = config.lam_low + (config.lam_high - config.lam_low) * float(
                    torch.rand((), generator=generator)
                )
                mats = {
                    n: straight_through(
                        spec[n].group,
                        conts[n],
                        relax=relax,
                        temperature=config.temperature,
                        iters=config.sinkhorn_iters,
                    )
                    for n in names
                }
                moved = apply_dense(spec, b, mats)
                theta = {}
                for k, va in a.items():
                    if not va.is_floating_point():
                        theta[k] = va.clone()  # BatchNorm counts batches in place
                    elif k in buffers:
                        # running statistics: unused in train mode, and BatchNorm updates
                        # them in place, so they must not be part of the graph
                        theta[k] = ((1 - lam) * va + lam * moved[k]).detach().clone()
                    else:
                        theta[k] = (1 - lam) * va + lam * moved[k]
                opt.zero_grad(set_to_none=True)
                value = torch.zeros((), device=device)
                if len(xs):
                    value = loss(functional_call(model, theta, (xs,)), ys)
                    if len(xs) < len(xb):  # this process's part of the batch mean
                        value = value * (len(xs) / len(xb))
                    value.backward()
                (value,) = sum_gradients(list(conts.values()), [value], mean=batchnorm)
                if not torch.isfinite(value):
                    raise FloatingPointError(f"learned matching diverged at step {step}")
                opt.step()
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{value.item():.4f}", best=f"{best_loss:.4f}")
                out_of_time = config.max_seconds is not None and any_rank(
                    time.perf_counter() - start > config.max_seconds
                )
                if step % config.eval_every == 0 or step == config.steps or out_of_time:
                    candidate = hard_transform()
                    val_loss = midpoint(candidate)
                    history.append(val_loss)
                    if val_loss < best_loss:
                        best, best_loss, stale = candidate, val_loss, 0
                    else:
                        stale += 1
                if step >= config.steps or stale >= config.patience or out_of_time:
                    break
            if out_of_time:
                break
    finally:
        bar.close()
        model.train(was_training)

    ref = {k: v.float() for k, v in params_a.items() if v.is_floating_point()}
    other = {k: v.float() for k, v in params_b.items() if v.is_floating_point()}
    identity = Transform.identity(spec)
    diagnostics = {
        name: SpaceDiagnostics(
            space_objective(spec, spec[name], ref, other, identity),
            space_objective(spec, spec[name], ref, other, best),
        )
        for name in names
    }
    return AlignmentResult(
        transform=best,
        spaces=diagnostics,
        iterations=step,
        iteration_unit="steps",
        converged=stale >= config.patience,
        seconds=time.perf_counter() - start,
        history=history,
    )
