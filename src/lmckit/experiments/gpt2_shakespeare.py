"""GPT-2 on Tiny Shakespeare (BPE): the full barrier table of issue 3, item 2, in one run.

Generalized LMC for Transformers (2025), GPT-2 table. Models are trained (and cached
as checkpoints under ``out_dir``), then the linear path between two of them is measured
on the *test* split (``t`` in steps of 0.1, token cross-entropy) after each alignment:

* ``vanilla``: no alignment (the LayerNorm models as trained); every other row
  interpolates both models rewritten to RMSNorm form
  (:func:`lmckit.rewrites.layernorm_to_rmsnorm`, exact), so ``vanilla (RMS form)`` is
  their unaligned baseline;
* ``activation matching``: permutations of residual stream, heads and MLP units from
  activation correlations; ``(orthogonal), circuit form``: on the circuit forms (below),
  the residual stream by Procrustes on its cross-covariance, heads by their attention
  patterns, MLP units by correlation;
* ``WM (permutations only)`` / ``learned (permutations only)``: the residual stream
  permuted (``spec.with_groups(residual=Permutation())``), heads by QK/OV circuits;
* ``WM (orthogonal)`` / ``learned (orthogonal)``: the residual stream aligned by an
  orthogonal map; ``+ head bases``: then each matched head's query/key and value/output
  bases aligned by orthogonal maps (:func:`lmckit.align.match_head_bases`, data-free);
* ``..., circuit form``: both RMSNorm models with every head rewritten as its QK and OV
  circuit (:func:`lmckit.rewrites.heads_to_circuits`, exact), weight-matched and
  interpolated in that form, embedding and LM-head rows weighted by their tokens'
  training frequency (``unweighted tokens``: the ablation). The paper's code merges
  heads so (it "multiplies out" the within-head maps, and computes token frequencies),
  so these rows carry its numbers and the targets;
* width-heterogeneous: the narrow model embedded exactly into the wide one's shape
  (:func:`lmckit.rewrites.embed_in_wider`), then orthogonal WM (and learned matching)
  with the wide model as reference;
* three models: the multi-model barrier over the simplex, unaligned vs universe
  matching (RMSNorm forms, orthogonal residual maps; also in circuit form), with the
  triangle figure.

Weight matching (also as learned matching's start and inside universe matching) ignores
embedding/LM-head rows of tokens absent from the training split
(as the reference code does). Weight and activation matching run on the CPU (the solvers
are SciPy/NumPy); training, learned matching's forward and backward passes and path
evaluation run on ``cuda`` when it is available (training with TF32 matrix products,
everything measured in full float32). Every stage's result
is cached beside the checkpoints, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmckit import checkpoint
from lmckit.align import (
    AlignmentResult,
    LearnedMatchingConfig,
    UniverseConfig,
    WeightMatchingConfig,
    activation_matching,
    align_head_bases,
    learned_matching,
    orthogonal_activation_matching,
    universe_matching,
    weight_matching,
)
from lmckit.atomic import write_json
from lmckit.data import Dataset, batches
from lmckit.data.text import load_text, make_blocks, split_tokens, tokenize_file
from lmckit.evaluate import PathResult, evaluate_path, linear_grid
from lmckit.experiments.registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.models import ZooModel, create_model
from lmckit.params import Params
from lmckit.paths import SimplexResult, evaluate_simplex
from lmckit.plot import plot_paths, plot_simplex
from lmckit.rewrites import embed_in_wider, heads_to_circuits, layernorm_to_rmsnorm
from lmckit.symmetry import Permutation, SymmetrySpec, apply
from lmckit.train import TrainConfig, fit

__all__ = [
    "GPT2ShakespeareConfig",
    "PAPER_NUMBERS",
    "REFERENCE_NUMBERS",
    "TARGETS",
    "paper_config",
    "quick_config",
    "run_gpt2_shakespeare",
    "shakespeare_tokens",
    "token_row_weights",
]

PAPER = "Generalized linear mode connectivity for transformers (2025), GPT-2 table"

# Loss barriers reported by the paper (summaries) and by its own code run with its
# defaults on two seed pairs (DESIGN.md, "Numbers we know"); "-": not reported.
# Weight matching rows: the paper and its code interpolate heads as circuits, so their
# numbers sit beside our circuit-form rows.
PAPER_NUMBERS: dict[str, str] = {
    "vanilla": "2.02",
    "activation matching": "1.43",
    # the paper's weight matching is its orthogonal one
    "WM (orthogonal), circuit form": "0.34",
    "learned (permutations only)": "0.63",
    "learned (orthogonal)": "0.02",
}
REFERENCE_NUMBERS: dict[str, str] = {
    "vanilla": "1.56 / 1.65",
    "WM (permutations only), circuit form": "0.27 / 0.37",
    "WM (orthogonal), circuit form": "0.107 / 0.091",
    "learned (permutations only)": "0.27",
    "learned (orthogonal)": "0.00 / 0.00",
    "width 512 vs 256: WM (orthogonal), circuit form": "0.064",
    "width 512 vs 256: learned (orthogonal)": "0.00",
}
TARGETS: dict[str, str] = {
    "WM (orthogonal), circuit form": "<= 0.10",
    "learned (orthogonal)": "<= 0.02",
    "width 512 vs 256: WM (orthogonal), circuit form": "<= 0.07",
}

# the paths figure draws these rows (the table has them all): one colour each
PATH_FIGURE_ROWS: tuple[str, ...] = (
    "vanilla",
    "activation matching",
    "activation matching (orthogonal), circuit form",
    "WM (permutations only)",
    "WM (orthogonal)",
    "WM (orthogonal) + head bases",
    "WM (permutations only), circuit form",
    "WM (orthogonal), circuit form",
    "learned (orthogonal)",
)


@dataclass(frozen=True)
class GPT2ShakespeareConfig:
    """What the experiment computes (the paper setting by default).

    Attributes:
        n_layer, n_head, n_embd, n_inner, context: the GPT-2 pair's architecture.
        wide_embd, wide_inner: residual and MLP width of the width-heterogeneous partner.
        dropout: GPT-2 dropout while training.
        train: optimisation and early stopping (on the validation split).
        tokens: use only the first ``tokens`` BPE tokens of the text, with the vocabulary
            compacted to the ids that occur in them; ``None``: the whole text, full
            GPT-2 vocabulary (50,257).
        eval_batch_size: blocks per evaluation batch (logits are ``(B, context, vocab)``).
        stat_batches: training batches (of ``eval_batch_size``) for activation matching.
        points: path grid (11: ``t`` in steps of 0.1).
        weight: weight matching settings.
        learned: learned matching settings; ``None`` skips the learned rows.
        learned_width: also learn the width-heterogeneous alignment (about twice the
            cost of a narrow learned stage).
        universe_sweeps: maximum sweeps of universe matching.
        simplex_resolution: simplex grid step ``1 / resolution``.
    """

    n_layer: int = 6
    n_head: int = 4
    n_embd: int = 256
    n_inner: int = 1024
    context: int = 256
    wide_embd: int = 512
    wide_inner: int = 2048
    # Hugging Face GPT2Config's default (resid/embd/attn dropout 0.1), which the
    # reference code trains with: without it our models stop near epoch 16, not 25
    dropout: float = 0.1
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            epochs=60,
            batch_size=32,
            optimizer="adamw",
            lr=3e-4,
            weight_decay=0.01,
            schedule="cosine",
            warmup=0.05,
            patience=3,
            eval_batch_size=16,
        )
    )
    tokens: int | None = None
    eval_batch_size: int = 16
    stat_batches: int = 20
    points: int = 11
    weight: WeightMatchingConfig = field(default_factory=lambda: WeightMatchingConfig(max_iter=30))
    # 5 epochs of 37 steps at most (the reference ran 10; its barriers reach zero within
    # one or two), validation every epoch, and at most 75 s per stage
    learned: LearnedMatchingConfig | None = field(
        default_factory=lambda: LearnedMatchingConfig(
            steps=185,
            lr=0.01,
            batch_size=32,
            eval_every=37,
            patience=2,
            val_batches=4,
            max_seconds=75.0,
        )
    )
    learned_width: bool = True
    universe_sweeps: int = 8
    simplex_resolution: int = 10

    def __post_init__(self) -> None:
        if min(self.n_layer, self.n_head, self.n_embd, self.n_inner, self.context) < 1:
            raise ValueError(f"GPT-2 sizes must be positive in {self}")
        if self.wide_embd < self.n_embd or self.wide_inner < self.n_inner:
            raise ValueError("the wide model must be at least as wide as the pair")
        if self.wide_embd % self.n_head or self.n_embd % self.n_head:
            raise ValueError("widths must be multiples of n_head")
        if self.tokens is not None and self.tokens < 20 * (self.context + 1):
            raise ValueError(f"tokens={self.tokens} is too few for blocks of {self.context}")
        if min(self.eval_batch_size, self.stat_batches, self.universe_sweeps) < 1:
            raise ValueError(f"batch sizes and sweeps must be >= 1 in {self}")
        if self.points < 2 or self.simplex_resolution < 1:
            raise ValueError("a path needs >= 2 points and a simplex a resolution >= 1")

    def fingerprint(self) -> str:
        """Short hash of the config: cached checkpoints and stages belong to one config."""
        text = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:10]


def paper_config() -> GPT2ShakespeareConfig:
    """The paper's setting: 6 layers, 4 heads, width 256, MLP 1024, context 256."""
    return GPT2ShakespeareConfig()


def quick_config() -> GPT2ShakespeareConfig:
    """A CPU-seconds version: 1 layer, width 32, context 32, 30k tokens, ~80 steps."""
    return GPT2ShakespeareConfig(
        n_layer=1,
        n_head=2,
        n_embd=32,
        n_inner=128,
        context=32,
        wide_embd=64,
        wide_inner=256,
        dropout=0.0,
        train=TrainConfig(
            epochs=3,
            batch_size=32,
            optimizer="adamw",
            lr=3e-3,
            weight_decay=0.01,
            warmup=0.05,
            patience=2,
            eval_batch_size=64,
        ),
        tokens=30_000,
        eval_batch_size=64,
        stat_batches=4,
        weight=WeightMatchingConfig(max_iter=30),
        learned=LearnedMatchingConfig(
            steps=30, lr=0.01, batch_size=32, eval_every=10, patience=2, val_batches=2
        ),
        learned_width=True,
        universe_sweeps=5,
        simplex_resolution=4,
    )


# --------------------------------------------------------------------------- data


def shakespeare_tokens(
    text: str | Path, tokenizer: str | Path, *, block: int, tokens: int | None = None
) -> Dataset:
    """Tiny Shakespeare in GPT-2 BPE blocks, contiguous 90/5/5 train/val/test split.

    Args:
        text, tokenizer: ``tinyshakespeare/input.txt`` and ``gpt2_tokenizer/``.
        block: tokens per block (the context).
        tokens: keep only the first ``tokens`` ids and renumber the ids that occur in
            them ``0..V'-1`` (in id order), so a tiny model needs no 50,257-row
            embedding; ``None``: the whole text with the tokenizer's vocabulary.
    """
    if tokens is None:
        return load_text(text, tokenizer, block=block, name="tinyshakespeare")
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1 or None, got {tokens}")
    ids, _ = tokenize_file(text, tokenizer)
    ids = ids[:tokens]
    vocab, compact = torch.unique(ids, return_inverse=True)
    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = (
        make_blocks(p, block) for p in split_tokens(compact)
    )
    if min(len(x_tr), len(x_va), len(x_te)) == 0:
        raise ValueError(f"{tokens} tokens do not make a block of {block} in every split")
    return Dataset(
        "tinyshakespeare", x_tr, y_tr, x_te, y_te, num_classes=len(vocab), x_val=x_va, y_val=y_va
    )


def _seen_token_masks(data: Dataset) -> dict[str, Tensor]:
    """Rows of the embedding and LM head whose tokens occur in the training split."""
    seen = torch.zeros(data.num_classes, dtype=torch.bool)
    seen[data.x_train.unique()] = True
    seen[data.y_train.unique()] = True
    return {"transformer.wte.weight": seen, "lm_head.weight": seen}


def token_row_weights(data: Dataset) -> dict[str, Tensor]:
    """GPT-2 ``row_weights`` for weight matching: embedding rows weighted by how often their
    token is read, LM-head rows by how often it is predicted, in the training split; mean
    1 over the tokens that occur (so they weigh as much in total as with a mask)."""
    out = {}
    for key, ids in (("transformer.wte.weight", data.x_train), ("lm_head.weight", data.y_train)):
        counts = torch.bincount(ids.flatten(), minlength=data.num_classes).double()
        out[key] = (counts / counts[counts > 0].mean()).float()
    return out


def _masks_for(params: Params, masks: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v for k, v in masks.items() if k in params}


# --------------------------------------------------------------------------- running


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _Run:
    """Checkpoint and stage cache of one config under ``ctx.out_dir``, plus timings."""

    def __init__(self, ctx: ExperimentContext, config: GPT2ShakespeareConfig) -> None:
        self.ctx = ctx
        self.config = config
        self.root = ctx.out_dir / f"{'quick' if ctx.quick else 'paper'}-{config.fingerprint()}"
        self.device = _device()
        self.seconds: dict[str, float] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        resolved = json.loads(json.dumps(asdict(config), default=str))
        write_json(self.root / "config.json", resolved | {"seed": ctx.seed, "quick": ctx.quick})

    def stage(self, name: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``compute()`` (JSON-able), cached as ``stages/NAME.json``; time logged."""
        path = self.root / "stages" / f"{name}.json"
        if path.exists():
            self.ctx.log(f"[{name}] cached ({path})")
            return json.loads(path.read_text())
        start = time.perf_counter()
        self.ctx.log(f"[{name}] running")
        out = compute()
        seconds = time.perf_counter() - start
        out["stage_seconds"] = seconds
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, out)
        self.ctx.log(f"[{name}] done in {seconds:.1f} s")
        self.seconds[name] = seconds
        return out

    def model(
        self, name: str, data: Dataset, seed: int, **arch: int | float
    ) -> tuple[ZooModel, Params]:
        """Train (or load the cached checkpoint of) one LayerNorm GPT-2."""
        where = self.root / "models" / name
        if (where / checkpoint.CONFIG_FILE).exists():
            loaded = checkpoint.load(where)
            self.ctx.log(f"[train {name}] loaded {where}")
            return loaded.model, loaded.params
        module, init = create_model("gpt2", seed=seed, **arch)
        start = time.perf_counter()
        self.ctx.log(f"[train {name}] seed {seed}, {arch}, on {self.device}")
        with _tf32(self.device):
            result = fit(
                module,
                init,
                data,
                self.config.train,
                seed=seed,
                device=self.device,
                progress=self.ctx.progress,
            )
        seconds = time.perf_counter() - start
        meta = {
            "seed": seed,
            "steps": result.steps,
            "epochs": result.epochs,
            "stopped_early": result.stopped_early,
            "best_val_loss": None if result.best is None else result.best.loss,
            "train_seconds": seconds,
            "device": str(self.device),
        }
        checkpoint.save(where, module, result.params, metadata=meta)
        self.seconds[f"train {name}"] = seconds
        self.ctx.log(f"[train {name}] {result.steps} steps in {seconds:.1f} s, {meta}")
        return module, result.params

    # evaluation on the device, alignment on the CPU
    def path(self, module: ZooModel, a: Params, b: Params, data: Dataset) -> PathResult:
        work = copy.deepcopy(module).to(self.device)
        x, y = (t.to(self.device) for t in data.split("test"))
        return evaluate_path(
            work,
            _to(a, self.device),
            _to(b, self.device),
            lambda: batches(x, y, self.config.eval_batch_size),
            ts=linear_grid(self.config.points),
        )

    def simplex(self, module: ZooModel, models: list[Params], data: Dataset) -> SimplexResult:
        work = copy.deepcopy(module).to(self.device)
        x, y = (t.to(self.device) for t in data.split("test"))
        return evaluate_simplex(
            work,
            [_to(p, self.device) for p in models],
            lambda: batches(x, y, self.config.eval_batch_size),
            resolution=self.config.simplex_resolution,
        )


@contextmanager
def _tf32(device: torch.device) -> Iterator[None]:
    """TF32 matrix products on CUDA inside the block (training only), restored after."""
    before = torch.get_float32_matmul_precision()
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _to(params: Params, device: torch.device) -> Params:
    return {k: v.to(device) for k, v in params.items()}


def _path_entry(result: PathResult, **extra: Any) -> dict[str, Any]:
    return {"path": result.to_dict(), **extra}


# --------------------------------------------------------------------------- stages


def _wm_entry(
    run: _Run,
    data: Dataset,
    masks: dict[str, Tensor],
    spec: SymmetrySpec,
    module: ZooModel,
    pa: Params,
    pb: Params,
    *,
    config: WeightMatchingConfig | None = None,
    head_bases: bool = False,
    weights: dict[str, Tensor] | None = None,
) -> dict[str, Any]:
    """Path from ``pa`` to ``pb`` weight-matched to it (optionally with head bases, and
    with token rows weighted by ``weights``)."""
    res = weight_matching(
        spec,
        pa,
        pb,
        config or run.config.weight,
        seed=run.ctx.seed,
        row_masks=_masks_for(pa, masks),
        row_weights=None if weights is None else _masks_for(pa, weights),
    )
    moved = apply(spec, pb, res.transform)
    if head_bases:
        moved = align_head_bases(spec, pa, moved)
    return _path_entry(
        run.path(module, pa, moved, data),
        align_seconds=res.seconds,
        sweeps=res.iterations,
        converged=res.converged,
    )


def _learn(
    run: _Run,
    data: Dataset,
    masks: dict[str, Tensor],
    spec: SymmetrySpec,
    module: ZooModel,
    pa: Params,
    pb: Params,
) -> tuple[AlignmentResult, Params]:
    """Learned matching of ``pb`` to ``pa`` with the run's settings, and ``pb`` moved."""
    assert run.config.learned is not None
    res = learned_matching(
        module,
        spec,
        pa,
        pb,
        data,
        run.config.learned,
        seed=run.ctx.seed,
        device=run.device,
        progress=run.ctx.progress,
        row_masks=_masks_for(pa, masks),
    )
    return res, apply(spec, pb, res.transform)


def _pair_stages(
    run: _Run,
    data: Dataset,
    ln: ZooModel,
    a: Params,
    b: Params,
    masks: dict[str, Tensor],
    *,
    learned: bool,
) -> dict[str, dict[str, Any]]:
    """Every two-model row: vanilla, activation, weight and (with ``learned``) learned
    matching."""
    cfg = run.config
    rms, rms_a = layernorm_to_rmsnorm(ln, a)
    _, rms_b = layernorm_to_rmsnorm(ln, b)
    orth_spec = rms.symmetry_spec()  # residual: Orthogonal (RMSNorm commutes with it)
    perm_spec = orth_spec.with_groups(residual=Permutation())  # the ablation
    out: dict[str, dict[str, Any]] = {}

    out["vanilla"] = run.stage("vanilla", lambda: _path_entry(run.path(ln, a, b, data)))
    out["vanilla (RMS form)"] = run.stage(
        "vanilla-rms", lambda: _path_entry(run.path(rms, rms_a, rms_b, data))
    )

    circuits, circ_a = heads_to_circuits(rms, rms_a)
    _, circ_b = heads_to_circuits(rms, rms_b)
    circ_spec = circuits.symmetry_spec()
    circ_perm_spec = circ_spec.with_groups(residual=Permutation())

    def stat_inputs() -> list[Tensor]:
        limit = cfg.stat_batches
        return [x for x, _ in batches(data.x_train, data.y_train, cfg.eval_batch_size, limit=limit)]

    def activation() -> dict[str, Any]:
        res = activation_matching(rms, perm_spec, rms_a, rms_b, stat_inputs())
        moved = apply(perm_spec, rms_b, res.transform)
        return _path_entry(run.path(rms, rms_a, moved, data), align_seconds=res.seconds)

    def activation_circuits() -> dict[str, Any]:
        # residual by Procrustes on the streams' cross-covariance, heads by their
        # attention patterns, MLP units by correlation
        start = time.perf_counter()
        found = orthogonal_activation_matching(circuits, circ_spec, circ_a, circ_b, stat_inputs())
        seconds = time.perf_counter() - start
        moved = apply(circ_spec, circ_b, found)
        return _path_entry(run.path(circuits, circ_a, moved, data), align_seconds=seconds)

    out["activation matching"] = run.stage("activation", activation)
    out["activation matching (orthogonal), circuit form"] = run.stage(
        "activation-orth-circuits", activation_circuits
    )

    def wm(spec: SymmetrySpec, **options: Any) -> dict[str, Any]:
        return _wm_entry(run, data, masks, spec, rms, rms_a, rms_b, **options)

    out["WM (permutations only)"] = run.stage("wm-perm", lambda: wm(perm_spec))
    out["WM (orthogonal)"] = run.stage("wm-orth", lambda: wm(orth_spec))
    out["WM (orthogonal) + head bases"] = run.stage(
        "wm-orth-bases", lambda: wm(orth_spec, head_bases=True)
    )
    # the ablation of circuit-aware residual matching: heads' raw Q/K/V/O weights
    raw = replace(cfg.weight, residual_circuits=False)
    out["WM (orthogonal, raw head weights)"] = run.stage(
        "wm-orth-raw", lambda: wm(orth_spec, config=raw)
    )
    # token rows weighted by frequency, as the reference code's token_freqs; and the
    # ablation without
    weights = token_row_weights(data)
    for label, stage, spec, use in (
        ("permutations only", "wm-perm-circuits-freq", circ_perm_spec, weights),
        ("orthogonal", "wm-orth-circuits-freq", circ_spec, weights),
        ("orthogonal", "wm-orth-circuits", circ_spec, None),
    ):
        name = f"WM ({label}), circuit form" + ("" if use else ", unweighted tokens")
        out[name] = run.stage(
            stage,
            lambda spec=spec, use=use: _wm_entry(
                run, data, masks, spec, circuits, circ_a, circ_b, weights=use
            ),
        )

    if cfg.learned is not None and learned:

        def learn(spec: SymmetrySpec, module: ZooModel, pa: Params, pb: Params) -> dict:
            res, moved = _learn(run, data, masks, spec, module, pa, pb)
            # the heads' inner bases are outside the spec, so learning cannot move them:
            # aligned afterwards, the same path with them matched is a second row
            based = align_head_bases(spec, pa, moved)
            return _path_entry(
                run.path(module, pa, moved, data),
                align_seconds=res.seconds,
                steps=res.iterations,
                val_mid_loss=[res.history[0], min(res.history)],
                head_bases_path=run.path(module, pa, based, data).to_dict(),
            )

        out["learned (permutations only)"] = run.stage(
            "learned-perm", lambda: learn(perm_spec, rms, rms_a, rms_b)
        )
        out["learned (orthogonal)"] = run.stage(
            "learned-orth", lambda: learn(orth_spec, rms, rms_a, rms_b)
        )
        if "head_bases_path" in out["learned (orthogonal)"]:  # absent from older caches
            entry = out["learned (orthogonal)"]
            out["learned (orthogonal) + head bases"] = {
                "path": entry["head_bases_path"],
                "align_seconds": entry["align_seconds"],
                "stage_seconds": entry["stage_seconds"],
            }
    return out


def _width_stages(
    run: _Run,
    data: Dataset,
    ln: ZooModel,
    a: Params,
    wide_ln: ZooModel,
    wide: Params,
    masks: dict[str, Tensor],
    *,
    learned: bool,
) -> dict[str, dict[str, Any]]:
    """The narrow model (``a``) embedded into the wide one's shape, then aligned to it
    (with ``learned``, also by learned matching)."""
    cfg = run.config
    rms, rms_a = layernorm_to_rmsnorm(ln, a)
    wide_rms, rms_wide = layernorm_to_rmsnorm(wide_ln, wide)
    # the first n columns of the identity: an exact embedding; alignment finds the rotation
    emb_module, emb = embed_in_wider(
        rms,
        rms_a,
        cfg.wide_embd,
        inner=cfg.wide_inner,
        rotation=torch.eye(cfg.wide_embd, cfg.n_embd),
    )
    if emb_module.config.kwargs != wide_rms.config.kwargs:
        raise ValueError(
            "the embedded narrow model and the wide model differ in architecture: "
            f"{emb_module.config.kwargs} vs {wide_rms.config.kwargs}"
        )
    x = data.x_test[: min(4, len(data.x_test))]
    emb_module.eval()  # dropout off: the check compares functions
    rms.eval()
    with torch.no_grad():
        exact = float(
            (
                torch.func.functional_call(emb_module, emb, (x,))
                - torch.func.functional_call(rms, rms_a, (x,))
            )
            .abs()
            .max()
        )
    spec = wide_rms.symmetry_spec()
    out: dict[str, dict[str, Any]] = {}
    out["width 512 vs 256: vanilla (embedded)"] = run.stage(
        "width-vanilla",
        lambda: _path_entry(run.path(wide_rms, rms_wide, emb, data), embed_max_logit_diff=exact),
    )

    def wm(head_bases: bool = False) -> dict[str, Any]:
        return _wm_entry(run, data, masks, spec, wide_rms, rms_wide, emb, head_bases=head_bases)

    out["width 512 vs 256: WM (orthogonal)"] = run.stage("width-wm-orth", wm)
    out["width 512 vs 256: WM (orthogonal) + head bases"] = run.stage(
        "width-wm-orth-bases", lambda: wm(head_bases=True)
    )

    def wm_circuits() -> dict[str, Any]:
        circuits, circ_wide = heads_to_circuits(wide_rms, rms_wide)
        _, circ_emb = heads_to_circuits(emb_module, emb)
        spec = circuits.symmetry_spec()
        weights = token_row_weights(data)
        return _wm_entry(run, data, masks, spec, circuits, circ_wide, circ_emb, weights=weights)

    out["width 512 vs 256: WM (orthogonal), circuit form"] = run.stage(
        "width-wm-orth-circuits-freq", wm_circuits
    )
    if cfg.learned is not None and cfg.learned_width and learned:

        def learn() -> dict[str, Any]:
            res, moved = _learn(run, data, masks, spec, wide_rms, rms_wide, emb)
            return _path_entry(
                run.path(wide_rms, rms_wide, moved, data),
                align_seconds=res.seconds,
                steps=res.iterations,
            )

        out["width 512 vs 256: learned (orthogonal)"] = run.stage("width-learned-orth", learn)
    return out


def _simplex_stage(
    run: _Run, data: Dataset, ln: ZooModel, models: list[Params], masks: dict[str, Tensor]
) -> dict[str, dict[str, Any]]:
    """Three models over their simplex (RMSNorm forms): unaligned vs universe matching."""
    rms_models = []
    rms = ln
    for p in models:
        rms, q = layernorm_to_rmsnorm(ln, p)
        rms_models.append(q)
    spec = rms.symmetry_spec()

    def unaligned() -> dict[str, Any]:
        return {"simplex": run.simplex(rms, rms_models, data).to_dict()}

    def universe_in(
        spec: SymmetrySpec, models: list[Params], weights: dict[str, Tensor] | None = None
    ) -> tuple[dict, list[Params]]:
        res = universe_matching(
            spec,
            models,
            UniverseConfig(max_iter=run.config.universe_sweeps, inner=run.config.weight),
            seed=run.ctx.seed,
            row_masks=_masks_for(models[0], masks),
            row_weights=None if weights is None else _masks_for(models[0], weights),
        )
        timing = {"align_seconds": res.seconds, "sweeps": res.iterations}
        return timing | {"converged": res.converged}, res.aligned(spec, models)

    def universe() -> dict[str, Any]:
        timing, aligned = universe_in(spec, rms_models)
        # every model's head bases aligned to the first model's (outside the spec)
        based = [aligned[0]] + [align_head_bases(spec, aligned[0], p) for p in aligned[1:]]
        return {
            "simplex": run.simplex(rms, aligned, data).to_dict(),
            "head_bases_simplex": run.simplex(rms, based, data).to_dict(),
            **timing,
        }

    def universe_circuits() -> dict[str, Any]:
        circuits, circ_models = rms, []
        for p in rms_models:
            circuits, q = heads_to_circuits(rms, p)
            circ_models.append(q)
        spec = circuits.symmetry_spec()
        timing, aligned = universe_in(spec, circ_models, token_row_weights(data))
        return {"simplex": run.simplex(circuits, aligned, data).to_dict(), **timing}

    out = {
        "3 models: unaligned": run.stage("simplex-unaligned", unaligned),
        "3 models: universe matching": run.stage("simplex-universe", universe),
        "3 models: universe matching, circuit form": run.stage(
            "simplex-universe-circuits-freq", universe_circuits
        ),
    }
    entry = out["3 models: universe matching"]
    if "head_bases_simplex" in entry:  # absent from older caches
        out["3 models: universe matching + head bases"] = {
            "simplex": entry["head_bases_simplex"],
            "align_seconds": entry["align_seconds"],
            "stage_seconds": entry["stage_seconds"],
        }
    return out


# --------------------------------------------------------------------------- table


def _label(name: str, width: int, narrow: int) -> str:
    return name.replace("512 vs 256", f"{width} vs {narrow}")


def _row(name: str, entry: dict[str, Any], label: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "method": label,
        "paper": PAPER_NUMBERS.get(name, "-"),
        "reference": REFERENCE_NUMBERS.get(name, "-"),
        "target": TARGETS.get(name, "-"),
        "stage_seconds": entry.get("stage_seconds"),
        "align_seconds": entry.get("align_seconds"),
    }
    if "simplex" in entry:
        res = SimplexResult.from_dict(entry["simplex"])
        return row | {
            "barrier_loss": res.barrier_loss,
            "barrier_acc": res.barrier_acc,
            "end_losses": res.vertex_loss,
            "centroid_loss": res.centroid_loss,
        }
    path = PathResult.from_dict(entry["path"])
    extra = {k: entry[k] for k in ("sweeps", "steps", "embed_max_logit_diff") if k in entry}
    return row | {
        "barrier_loss": path.barrier_loss,
        "barrier_acc": path.barrier_acc,
        "mid_loss": path.midpoint_loss,
        "end_losses": [path.loss[0], path.loss[-1]],
        "loss": path.loss,
        **extra,
    }


def _format(rows: list[dict[str, Any]]) -> str:
    w = max(len("method"), *(len(r["method"]) for r in rows)) + 2
    head = (
        f"{'method':<{w}}{'loss barrier':>13}{'acc barrier':>12}{'paper':>7}"
        f"{'reference code':>16}{'target':>9}{'align s':>9}{'stage s':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        barrier = "n/a" if r["barrier_loss"] is None else f"{r['barrier_loss']:.4f}"
        acc = "n/a" if r["barrier_acc"] is None else f"{100 * r['barrier_acc']:.2f}%"
        align = "-" if r["align_seconds"] is None else f"{r['align_seconds']:.1f}"
        stage = "-" if r["stage_seconds"] is None else f"{r['stage_seconds']:.1f}"
        lines.append(
            f"{r['method']:<{w}}{barrier:>13}{acc:>12}{r['paper']:>7}{r['reference']:>16}"
            f"{r['target']:>9}{align:>9}{stage:>9}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- experiment


def run_gpt2_shakespeare(ctx: ExperimentContext, config: GPT2ShakespeareConfig) -> ExperimentResult:
    """The whole pipeline for ``config`` (see the module docstring)."""
    start = time.perf_counter()
    run = _Run(ctx, config)
    data = shakespeare_tokens(
        ctx.data("tinyshakespeare") / "input.txt",
        ctx.data("gpt2_tokenizer"),
        block=config.context,
        tokens=config.tokens,
    )
    ctx.log(
        f"data: {len(data.x_train)}/{len(data.split('val')[0])}/{len(data.x_test)} blocks of "
        f"{config.context}, vocabulary {data.num_classes}; device {run.device}"
    )
    arch: dict[str, int | float] = {
        "vocab_size": data.num_classes,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "n_inner": config.n_inner,
        "context": config.context,
        "dropout": config.dropout,
    }
    s = ctx.seed
    ln, a = run.model(f"gpt2-{config.n_embd}-seed{s}", data, s, **arch)
    _, b = run.model(f"gpt2-{config.n_embd}-seed{s + 1}", data, s + 1, **arch)
    _, c = run.model(f"gpt2-{config.n_embd}-seed{s + 2}", data, s + 2, **arch)
    # the wide model's eps is the narrow one's times n/m: embed_in_wider rescales eps so,
    # and the embedded and wide models must be one architecture to be interpolated
    wide_arch = arch | {
        "n_embd": config.wide_embd,
        "n_inner": config.wide_inner,
        "layer_norm_epsilon": 1e-5 * config.n_embd / config.wide_embd,
    }
    wide_ln, wide = run.model(f"gpt2-{config.wide_embd}-seed{s + 1}", data, s + 1, **wide_arch)

    masks = _seen_token_masks(data)
    # the data-free stages first, so that a run cut short has them all cached; the
    # second pass loads them and adds the learned rows
    for learned in (False, True):
        entries = _pair_stages(run, data, ln, a, b, masks, learned=learned)
        entries |= _width_stages(run, data, ln, a, wide_ln, wide, masks, learned=learned)
        entries |= _simplex_stage(run, data, ln, [a, b, c], masks)

    rows = [
        _row(name, e, _label(name, config.wide_embd, config.n_embd)) for name, e in entries.items()
    ]
    figures = [
        plot_paths(
            {k: PathResult.from_dict(entries[k]["path"]) for k in PATH_FIGURE_ROWS if k in entries},
            ctx.out_dir / "gpt2_shakespeare_paths.png",
            title="GPT-2 on Tiny Shakespeare: test loss along the linear path",
        ),
        plot_simplex(
            {
                k.removeprefix("3 models: "): SimplexResult.from_dict(e["simplex"])
                for k, e in entries.items()
                if "simplex" in e
            },
            ctx.out_dir / "gpt2_shakespeare_simplex.png",
            labels=(f"seed {s}", f"seed {s + 1}", f"seed {s + 2}"),
            title="3 GPT-2s: test loss over the simplex (RMSNorm forms)",
        ),
    ]
    models = {}
    for name in sorted((run.root / "models").iterdir()):
        models[name.name] = checkpoint.load_metadata(name)
    wall = time.perf_counter() - start
    notes = (
        f"config {config.fingerprint()} ({'quick' if ctx.quick else 'paper'}), device "
        f"{run.device}, cache {run.root}; wall {wall:.1f} s this run; "
        f"stage seconds this run: {json.dumps({k: round(v, 1) for k, v in run.seconds.items()})}"
        f"; models: {json.dumps(models)}"
    )
    return ExperimentResult(_format(rows), rows, figures, notes)


@register_experiment("gpt2-shakespeare", paper=PAPER)
def gpt2_shakespeare(ctx: ExperimentContext) -> ExperimentResult:
    """GPT-2 on Tiny Shakespeare (BPE): vanilla / AM / WM / learned / width / simplex barriers."""
    config = quick_config() if ctx.quick else paper_config()
    return run_gpt2_shakespeare(ctx, config)
