"""``coherence`` (Q4, Fig. 6): midpoint barrier of W-asymmetric students against coherence.

Teacher ``relu(z1 + z2)`` on a 2-D latent embedded by ``c`` copies (subspace coherence
``1/c``; exact-copy and random-frame families); a one-hidden-layer W-asymmetric student
(``κ = 0``) is trained on the mean squared error and its midpoint barrier measured,
both through the library's regression task (:func:`lmckit.training.mse`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.data._regression import RegressionData
from lmckit.diagnostics._identifiability import chord_deviation, coherence, input_subspace
from lmckit.experiments._identifiability._asymmetric import AsymLinear, asym_parts
from lmckit.experiments._identifiability.common import PAPER
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.measure._evaluate import evaluate_path
from lmckit.measure._table import Column, format_table
from lmckit.symmetry._params import Params
from lmckit.training._task import mse
from lmckit.training._train import TrainConfig

__all__ = ["FAMILIES", "coherence_embedding"]

FAMILIES = ("exact-copy", "random-frame")


def coherence_embedding(
    copies: int, ambient: int, family: str, *, generator: torch.Generator | None = None
) -> Tensor:
    """Embedding ``E`` (``(ambient, 2)``, orthonormal columns) of a 2-D latent (App. F.5).

    ``exact-copy``: ``x[r] = z_1 / √c`` for ``r < c`` and ``x[c + r] = z_2 / √c``.
    ``random-frame``: ``c`` pairs of coordinates ``(π(2r), π(2r+1))`` each hold
    ``R(θ_r) z / √c`` for a random permutation ``π`` and angles ``θ_r`` (drawn from
    ``generator``; reuse one generator state to keep them across ``c``). Both have
    subspace coherence ``1 / c``. Needs ``2c <= ambient``.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if copies < 1 or 2 * copies > ambient:
        raise ValueError(f"need 1 <= copies <= ambient / 2, got {copies} and {ambient}")
    emb = torch.zeros(ambient, 2)
    scale = 1 / math.sqrt(copies)
    if family == "exact-copy":
        emb[:copies, 0] = scale
        emb[copies : 2 * copies, 1] = scale
        return emb
    gen = generator or torch.Generator().manual_seed(0)
    perm = torch.randperm(ambient, generator=gen)
    angles = 2 * math.pi * torch.rand(ambient // 2, generator=gen)
    for r in range(copies):
        c, s = math.cos(float(angles[r])), math.sin(float(angles[r]))
        emb[perm[2 * r]] = torch.tensor([c, -s]) * scale
        emb[perm[2 * r + 1]] = torch.tensor([s, c]) * scale
    return emb


class _Student(nn.Module):
    """``f(x) = Σ_i relu(w_iᵀ x + b_i)``: W-asymmetric hidden layer, output weights 1."""

    def __init__(self, ambient: int, width: int, *, num_fixed: int, mask_seed: int) -> None:
        super().__init__()
        linear = nn.Linear(ambient, width)
        mask, offset = asym_parts(
            linear.weight.shape,
            kappa=0.0,
            num_fixed=num_fixed,
            mode="wasym",
            mask_seed=mask_seed,
            fixed_seed=0,
            layer=0,
        )
        self.hidden = AsymLinear(linear, mask, offset)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.hidden(x)).sum(-1)

    def hidden_layer(self) -> nn.Module:
        """``x -> relu(hidden(x))`` with the same parameter names (``hidden.*``)."""
        return nn.Sequential(OrderedDict(hidden=self.hidden, act=nn.ReLU()))


def _student(ambient: int, width: int, *, mask_seed: int, seed: int) -> tuple[_Student, Params]:
    """A student with initial weights drawn from ``seed`` (its fixed mask from ``mask_seed``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = _Student(ambient, width, num_fixed=ambient // 2, mask_seed=mask_seed)
    return module, {k: v.detach().clone() for k, v in module.state_dict().items()}


def _teacher(z: Tensor) -> Tensor:
    return torch.relu(z[:, 0] + z[:, 1])


COLUMNS = (
    Column("family", "family", align="<"),
    Column("copies", "copies"),
    Column("coherence", "coherence", ".4f"),
    Column("measured", "measured_coherence", ".4f"),
    Column(
        "mid barrier",
        lambda r: f"{r['midpoint_barrier_mean']:.4f}±{r['midpoint_barrier_std']:.4f}",
    ),
    Column("end MSE", "endpoint_mse", ".4f"),
    Column("chord dev", "chord_deviation_mid", ".4f"),
    Column("pairs", "pairs"),
)


def _whole(x: Tensor, y: Tensor) -> list[tuple[Tensor, Tensor]]:
    """The split as one batch."""
    return [(x, y)]


#: Ambient dimension of the embeddings and hidden width of the students.
AMBIENT, WIDTH = 32, 16


@register_experiment("coherence", paper=PAPER)
def coherence_experiment(ctx: ExperimentContext) -> ExperimentResult:
    """Teacher relu(z1 + z2) on c-copy embeddings: midpoint barrier vs coherence 1/c."""
    quick = ctx.quick
    width = WIDTH
    copies_list = (1, 16) if quick else (1, 2, 4, 8, 16)
    outer = 1 if quick else 2
    pairs = 1 if quick else 3
    # AdamW (weight decay 1e-4) on the mean squared error, constant learning rate
    config = TrainConfig(
        epochs=5 if quick else 20,
        batch_size=64,
        optimizer="adamw",
        lr=1e-2,
        weight_decay=1e-4,
        schedule="constant",
    )
    run = Runner(
        ctx,
        {"copies": copies_list, "outer": outer, "pairs": pairs, "train": config, "width": width},
    )
    gen = torch.Generator().manual_seed(ctx.seed)
    z_train = torch.randn(2048, 2, generator=gen)
    z_test = torch.randn(1024, 2, generator=gen)
    rows = []
    for family in FAMILIES:
        for copies in copies_list:
            rows.append(_row(run, family, copies, (z_train, z_test), outer, pairs, config))
    figure = _coherence_figure(run, rows)
    return run.result(format_table(rows, COLUMNS), rows, [figure])


def _teacher_data(
    family: str, copies: int, o: int, seed: int, latents: tuple[Tensor, Tensor]
) -> RegressionData:
    """The teacher's data on the ``o``-th embedding of ``family`` with ``copies`` copies."""
    z_train, z_test = latents
    frame = torch.Generator().manual_seed(1000 * (seed + 1) + o)
    emb = coherence_embedding(copies, AMBIENT, family, generator=frame)
    return RegressionData(
        f"teacher-{family}-c{copies}-o{o}",
        z_train @ emb.T,
        _teacher(z_train),
        z_test @ emb.T,
        _teacher(z_test),
    )


def _row(
    run: Runner,
    family: str,
    copies: int,
    latents: tuple[Tensor, Tensor],
    outer: int,
    pairs: int,
    config: TrainConfig,
) -> dict[str, Any]:
    """One table row: student pairs on ``outer`` embeddings of one family and coherence,
    their midpoint barriers, endpoint losses, chord deviations and measured coherence."""
    seed = run.ctx.seed
    barriers, end_losses, measured, chords = [], [], [], []
    for o in range(outer):
        data = _teacher_data(family, copies, o, seed, latents)
        measured.append(coherence(input_subspace(data.x_train, explained=0.999)))
        for p in range(pairs):
            seeds = (10_000 * o + 2 * p + seed, 10_000 * o + 2 * p + 1 + seed)
            student, pa, pb = _student_pair(run, family, copies, o, seeds, data, config)
            test = partial(_whole, *data.split("test"))
            path = evaluate_path(student, pa, pb, test, ts=[0.0, 0.5, 1.0], task=mse())
            ends = (path.loss[0] + path.loss[-1]) / 2
            barriers.append(path.midpoint_loss - ends)
            end_losses.append(ends)
            layer = student.hidden_layer()
            chords.append(chord_deviation(layer, pa, pb, data.x_test, ts=(0.5,))[0])
    bt = torch.tensor(barriers)
    run.ctx.log(f"coherence: {family} c={copies}: barrier {float(bt.mean()):.4f}")
    return {
        "family": family,
        "copies": copies,
        "coherence": 1 / copies,
        "measured_coherence": sum(measured) / len(measured),
        "midpoint_barrier_mean": float(bt.mean()),
        "midpoint_barrier_std": float(bt.std()) if len(barriers) > 1 else 0.0,
        "endpoint_mse": sum(end_losses) / len(end_losses),
        "chord_deviation_mid": sum(chords) / len(chords),
        "pairs": len(barriers),
    }


def _student_pair(
    run: Runner,
    family: str,
    copies: int,
    frame: int,
    seeds: tuple[int, int],
    data: RegressionData,
    config: TrainConfig,
) -> tuple[Any, Params, Params]:
    """Two students of one frame (mask seed) trained from ``seeds`` (cached by the run)."""
    trained = []
    for s in seeds:
        student, params = run.train(
            f"{family}-c{copies}-o{frame}-seed{s}",
            partial(_student, AMBIENT, WIDTH, mask_seed=frame, seed=s),
            data,
            config,
            seed=s,
            task=mse(),
        )
        trained.append(params)
    return student, trained[0], trained[1]


def _coherence_figure(run: Runner, rows: list[dict[str, Any]]) -> Path:
    """Midpoint barrier against coherence, one line per embedding family."""
    fig, ax = run.subplots(figsize=(6, 4), constrained_layout=True)
    for family in FAMILIES:
        fam = [r for r in rows if r["family"] == family]
        ax.errorbar(
            [r["coherence"] for r in fam],
            [r["midpoint_barrier_mean"] for r in fam],
            yerr=[r["midpoint_barrier_std"] for r in fam],
            fmt="o-",
            capsize=3,
            label=family,
        )
    ax.set_xscale("log")
    ax.set_xlabel("subspace coherence 1/c")
    ax.set_ylabel("midpoint MSE barrier (test)")
    ax.legend()
    return run.save_figure(fig, "coherence.png")
