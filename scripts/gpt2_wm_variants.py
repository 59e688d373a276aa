"""Ablations of orthogonal weight matching on a trained GPT-2 pair (a study, not the API).

Measures the test loss barrier (11 points) between two GPT-2s on Tiny Shakespeare after
orthogonal weight matching in several variants: the default (heads seen by the residual
through QK/OV circuits), the default followed by within-head basis alignment
(``head_bases_matching``), raw head weights, the residual matched on the embeddings and LM
head alone, embedding/LM-head rows weighted by sqrt(token frequency), and both models in
circuit form (``aligned_form(..., circuits=True)``: heads interpolated as QK/OV
circuits, as the paper's code does), orthogonal and permutations only, with and without
token-frequency weights on the embedding and LM-head rows; with ``--learned``, also
learned matching (orthogonal).

``--config paper`` / ``quick`` read the models that ``lmckit reproduce gpt2-shakespeare
[--quick] --out OUT`` trained (the run folder ``OUT/paper-*`` or ``OUT/quick-*``, whose
``config.json`` gives the data setting); ``--config proxy`` trains (and caches under OUT) a
CPU-sized pair: 2 layers, 4 heads, width 128, MLP 512, context 64, the first 120,000
BPE tokens, AdamW 1e-3, 6 epochs; ``--config mid`` a larger one with the paper's head
width: 4 layers, 4 heads of 64, width 256, MLP 1024, context 128, the first 300,000
tokens, dropout 0.1, AdamW 1e-3, 8 epochs (about half an hour per pair on 2 cores);
``--config compact`` the paper's recipe on the whole text with the vocabulary compacted to
the BPE ids that occur. ``--train-only`` trains and caches the model of ``--seed`` alone,
so the two models of a pair can train in two processes at once (the compact pair: 80
minutes, one core each). Imports only lmckit's public library (no experiment code).

    python scripts/gpt2_wm_variants.py runs/gpt2 --data-root ../shared/data --seed 1
    python scripts/gpt2_wm_variants.py /tmp/proxy --config proxy --learned
    OMP_NUM_THREADS=1 python scripts/gpt2_wm_variants.py /tmp/c --config compact \
        --seed 1 --train-only
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lmckit.aligners import (
    LearnedMatchingConfig,
    WeightMatchingConfig,
    head_bases_matching,
    learned_matching,
    weight_matching,
)
from lmckit.data import Dataset, batches
from lmckit.data._token_stats import seen_token_masks, text_prefix, token_row_weights
from lmckit.formats import _checkpoint as checkpoint
from lmckit.forms._recipe import aligned_form
from lmckit.measure._evaluate import evaluate_path, linear_grid
from lmckit.models import create_model
from lmckit.symmetry._transform import Permutation, SymmetrySpec, apply
from lmckit.training._train import TrainConfig, fit

EMBEDDINGS = ("transformer.wte", "transformer.wpe", "lm_head")


@dataclass(frozen=True)
class Setting:
    """A GPT-2 pair: architecture, training, data (first ``tokens`` BPE tokens, compacted
    vocabulary; ``None``: the whole text, full vocabulary) and learned matching."""

    n_layer: int
    n_head: int
    n_embd: int
    n_inner: int
    context: int
    dropout: float
    train: TrainConfig
    tokens: int | None
    learned: LearnedMatchingConfig | None = None

    def fingerprint(self) -> str:
        """Short hash of the setting: its trained models are cached under it."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:10]


PROXY = Setting(
    n_layer=2,
    n_head=4,
    n_embd=128,
    n_inner=512,
    context=64,
    dropout=0.0,
    train=TrainConfig(
        epochs=6,
        batch_size=32,
        optimizer="adamw",
        lr=1e-3,
        weight_decay=0.01,
        schedule="cosine",
        warmup=0.05,
        patience=2,
        eval_batch_size=64,
    ),
    tokens=120_000,
    learned=LearnedMatchingConfig(steps=150, batch_size=32, eval_every=25, patience=3),
)

MID = dataclasses.replace(
    PROXY,
    n_layer=4,
    n_embd=256,
    n_inner=1024,
    context=128,
    dropout=0.1,
    train=dataclasses.replace(PROXY.train, epochs=8, eval_batch_size=32),
    tokens=300_000,
)

# The paper's recipe (6 layers, context 256, AdamW 3e-4, cosine over 60 epochs, early
# stopping) on the whole text, with the vocabulary compacted to the ~11k BPE ids that occur:
# a full 50,257-row LM head makes a CPU step 3x slower, and the rows of tokens that never
# occur carry no weight in token-frequency weighted matching anyway.
COMPACT = Setting(
    n_layer=6,
    n_head=4,
    n_embd=256,
    n_inner=1024,
    context=256,
    dropout=0.1,
    train=TrainConfig(
        epochs=60,
        batch_size=32,
        optimizer="adamw",
        lr=3e-4,
        weight_decay=0.01,
        schedule="cosine",
        warmup=0.05,
        patience=3,
        eval_batch_size=16,
    ),
    tokens=10**9,
    learned=LearnedMatchingConfig(
        steps=185,
        lr=0.01,
        batch_size=32,
        eval_every=37,
        patience=2,
        val_batches=4,
        max_seconds=75.0,
    ),
)
TRAINED_HERE = {"proxy": PROXY, "mid": MID, "compact": COMPACT}
#: settings whose models ``lmckit reproduce gpt2-shakespeare [--quick]`` trained
FROM_EXPERIMENT = ("paper", "quick")


def _experiment_setting(out: Path, name: str) -> tuple[Path, Setting]:
    """The run folder ``OUT/NAME-*`` of the experiment and its setting (its config.json)."""
    found = sorted(p for p in out.glob(f"{name}-*") if (p / "config.json").is_file())
    if len(found) != 1:
        raise SystemExit(
            f"expected one run folder {out}/{name}-* of `lmckit reproduce gpt2-shakespeare`, "
            f"found {len(found)}"
        )
    cfg = json.loads((found[0] / "config.json").read_text())["config"]
    fields = {f.name for f in dataclasses.fields(Setting)} - {"train", "learned"}
    learned = cfg.get("learned")
    setting = Setting(
        **{k: cfg[k] for k in fields},
        train=TrainConfig(**cfg["train"]),
        learned=None if learned is None else LearnedMatchingConfig(**learned),
    )
    return found[0], setting


def setup(out: Path, name: str, setting: Setting, data_root: Path) -> tuple[Path, Dataset]:
    """The cache folder of setting ``name`` under ``out`` and its token data."""
    data = text_prefix(
        data_root / "tinyshakespeare" / "input.txt",
        data_root / "gpt2_tokenizer",
        block=setting.context,
        tokens=setting.tokens,
        name="tinyshakespeare",
    )
    return out / f"{name}-{setting.fingerprint()}", data


def _residual_only_from(spec: SymmetrySpec, prefixes: tuple[str, ...]) -> SymmetrySpec:
    """The spec with the residual compared on parameters starting with ``prefixes`` only."""
    spaces = []
    for s in spec:
        if s.name == "residual":
            uses = tuple(
                dataclasses.replace(u, compare=u.param.startswith(prefixes)) for u in s.uses
            )
            s = dataclasses.replace(s, uses=uses)
        spaces.append(s)
    return SymmetrySpec(tuple(spaces))


def _model(
    root: Path, config: Setting, data: Dataset, seed: int, train: bool, progress: bool = False
) -> checkpoint.Checkpoint:
    """The LayerNorm checkpoint of ``seed``, trained first when ``train`` and missing."""
    where = root / "models" / f"gpt2-{config.n_embd}-seed{seed}"
    if not (where / checkpoint.CONFIG_FILE).exists():
        if not train:
            raise SystemExit(f"{where} does not exist: run `lmckit reproduce` first")
        module, init = create_model(
            "gpt2",
            seed=seed,
            vocab_size=data.num_classes,
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_embd=config.n_embd,
            n_inner=config.n_inner,
            context=config.context,
            dropout=config.dropout,
        )
        result = fit(module, init, data, config.train, seed=seed, progress=progress)
        checkpoint.save(where, module, result.params)
        print(f"seed {seed}: trained {result.steps} steps", flush=True)
    return checkpoint.load(where)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the --out folder of gpt2-shakespeare")
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--seed", type=int, default=0, help="the pair is seeds s and s + 1")
    choices = sorted([*FROM_EXPERIMENT, *TRAINED_HERE])
    parser.add_argument("--config", choices=choices, default="paper")
    parser.add_argument("--learned", action="store_true", help="also learned matching")
    parser.add_argument(
        "--train-only", action="store_true", help="train (cache) model --seed alone and stop"
    )
    args = parser.parse_args()
    if args.config in FROM_EXPERIMENT:
        root, config = _experiment_setting(args.out, args.config)
        _, data = setup(args.out, args.config, config, args.data_root)
    else:
        config = TRAINED_HERE[args.config]
        root, data = setup(args.out, args.config, config, args.data_root)
    train = args.config in TRAINED_HERE
    if args.train_only:
        _model(root, config, data, args.seed, train=train, progress=True)
        return
    seeds = (args.seed, args.seed + 1)
    la, lb = (_model(root, config, data, seed, train=train) for seed in seeds)
    form = aligned_form(la.module, la.params, lb.params, symmetry="orthogonal")
    rms, a, b = form.module, form.a, form.b
    masks = seen_token_masks(data)
    seen = masks["lm_head.weight"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = (t.to(device) for t in data.split("test"))
    work = rms.to(device)
    a_dev = {k: v.to(device) for k, v in a.items()}

    def barrier(moved: dict, module=work, ref=a_dev) -> float:
        pb = {k: v.to(device) for k, v in moved.items()}
        return evaluate_path(
            module, ref, pb, lambda: batches(x, y, 16), ts=linear_grid(11)
        ).barrier_loss

    spec = rms.symmetry_spec()
    counts = torch.bincount(data.y_train.flatten(), minlength=data.num_classes).float()
    scale = (counts.sqrt() / counts.sqrt()[seen].mean()).sqrt()[:, None]  # rows: sqrt(freq)
    a_freq = a | {k: a[k] * scale for k in masks}
    b_freq = b | {k: b[k] * scale for k in masks}
    wm = WeightMatchingConfig(max_iter=30)
    variants = {
        "default (circuits)": (spec, a, b, wm),
        "raw head weights": (spec, a, b, dataclasses.replace(wm, residual_circuits=False)),
        "embeddings and LM head only": (_residual_only_from(spec, EMBEDDINGS), a, b, wm),
        "sqrt-frequency token rows": (spec, a_freq, b_freq, wm),
    }
    pair = f"{args.config} seeds {seeds[0]},{seeds[1]}"
    print(f"{pair}: vanilla (RMS form) {barrier(b):.4f}", flush=True)
    for name, (s, pa, pb, cfg) in variants.items():
        start = time.perf_counter()
        res = weight_matching(s, pa, pb, cfg, row_masks=masks)
        moved = apply(s, b, res.transform)
        seconds = time.perf_counter() - start
        print(f"{pair}: WM orthogonal, {name}: barrier {barrier(moved):.4f}, {seconds:.1f} s")
        if name.startswith("default"):
            based = head_bases_matching(spec, a, moved).apply(moved)
            print(f"{pair}: WM orthogonal, default + head bases: barrier {barrier(based):.4f}")
    circuit_form = aligned_form(rms, a, b, circuits=True)
    circuits, ca, cb = circuit_form.module, circuit_form.a, circuit_form.b
    circuit_spec = circuits.symmetry_spec()
    circuit_work = circuits.to(device)
    ca_dev = {k: v.to(device) for k, v in ca.items()}
    print(f"{pair}: vanilla (circuit form) {barrier(cb, circuit_work, ca_dev):.4f}")
    # token rows weighted by training frequency (the experiment's circuit-form rows)
    weights = token_row_weights(data)
    circuit_perm_spec = circuit_spec.with_groups(residual=Permutation())
    for name, s, row_weights in (
        ("orthogonal", circuit_spec, None),
        ("permutations only", circuit_perm_spec, None),
        ("orthogonal, token-frequency weights", circuit_spec, weights),
        ("permutations only, token-frequency weights", circuit_perm_spec, weights),
    ):
        start = time.perf_counter()
        res = weight_matching(s, ca, cb, wm, row_masks=masks, row_weights=row_weights)
        moved = apply(s, cb, res.transform)
        seconds = time.perf_counter() - start
        print(
            f"{pair}: WM {name}, circuit form: "
            f"barrier {barrier(moved, circuit_work, ca_dev):.4f}, {seconds:.1f} s"
        )
    if args.learned and config.learned is not None:
        start = time.perf_counter()
        res = learned_matching(
            spec, a, b, config.learned, model=rms, data=data, row_masks=masks, device=device
        )
        moved = apply(spec, b, res.transform)
        seconds = time.perf_counter() - start
        print(
            f"{pair}: learned orthogonal ({res.iterations} steps): "
            f"barrier {barrier(moved):.4f}, {seconds:.1f} s"
        )


if __name__ == "__main__":
    main()
