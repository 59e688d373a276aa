"""Two Llama-style models on Tiny Shakespeare: which symmetries connect them.

Two ``transformers`` ``LlamaForCausalLM`` models (grouped-query attention, rotary
embeddings, RMSNorm, gated SiLU MLP), built from one small config with different seeds
and trained on the characters of Tiny Shakespeare, are compared along the linear path
between them after each alignment. lmckit knows nothing about Llama: every symmetry is
inferred from the traced graph (:mod:`lmckit.inference`), and the orthogonal residual map
comes from folding the RMSNorm scales into the layers that read them
(:func:`lmckit.forms.aligned_form`).

Rows: the unaligned path (as trained, and with the norm scales folded, which changes the
path but not the ends), weight matching with permutations only, weight matching with an
orthogonal residual stream, activation matching (permutations; and orthogonal, by
covariance, in the folded form). Loss barriers on the held-out tenth of the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lmckit.aligners import (
    ActivationMatchingConfig,
    LearnedMatchingConfig,
    WeightMatchingConfig,
    activation_matching,
    learned_matching,
    weight_matching,
)
from lmckit.experiments._datasets import char_dataset
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.forms._recipe import aligned_form
from lmckit.symmetry._params import Params, module_params
from lmckit.symmetry._transform import SymmetrySpec, apply
from lmckit.training._train import TrainConfig

__all__ = ["LlamaShakespeareConfig", "llama_shakespeare"]

PAPER = "Generalized LMC for Transformers (2025), Table 1 setting on a Llama-style model"


@dataclass(frozen=True)
class LlamaShakespeareConfig:
    """The models, the data and the training (everything that fixes the results)."""

    chars: int = 400_000
    block: int = 128
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    inner: int = 384
    epochs: int = 3
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: float = 0.05
    eval_batch: int = 64
    stat_batches: int = 16
    learned_steps: int = 800
    learned_lr: float = 0.002


QUICK = LlamaShakespeareConfig(
    chars=30_000, block=32, hidden=32, layers=2, heads=4, kv_heads=2, inner=48, epochs=1,
    eval_batch=64, stat_batches=4, learned_steps=50,
)  # fmt: skip


def _build(config: LlamaShakespeareConfig, vocab: int, seed: int) -> tuple[Any, Params]:
    from lmckit.hf._build import import_transformers

    transformers = import_transformers()
    llama = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=config.hidden,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        intermediate_size=config.inner,
        max_position_embeddings=config.block,
        tie_word_embeddings=False,
        use_cache=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = transformers.LlamaForCausalLM(llama).eval()
    return module, {k: v.clone() for k, v in module_params(module).items()}


def _row(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    path = entry["path"]
    return {
        "method": name,
        "loss_barrier": path["barrier_loss"],
        "mid_loss": path["loss"][len(path["loss"]) // 2],
        "end_losses": [path["loss"][0], path["loss"][-1]],
        "align_seconds": entry.get("align_seconds"),
    }


@register_experiment("llama-shakespeare", paper=PAPER)
def llama_shakespeare(ctx: ExperimentContext) -> ExperimentResult:
    """Llama pair on Tiny Shakespeare: naive vs permutation WM vs orthogonal WM vs AM."""
    config = QUICK if ctx.quick else LlamaShakespeareConfig()
    run = Runner(ctx, config)
    data = char_dataset(
        ctx.data("tinyshakespeare") / "input.txt", chars=config.chars, block=config.block
    )
    train = TrainConfig(
        epochs=config.epochs,
        batch_size=config.batch_size,
        optimizer="adamw",
        lr=config.lr,
        weight_decay=config.weight_decay,
        warmup=config.warmup,
        grad_clip=1.0,
    )
    module, a, b = run.train_pair(
        "llama", lambda seed: _build(config, data.num_classes, seed), data, train
    )

    def path(pa: Params, pb: Params, **meta: Any) -> dict[str, Any]:
        result = run.path(module, pa, pb, data.x_test, data.y_test,
                          batch_size=config.eval_batch, meta=meta)  # fmt: skip
        return {"path": result.to_dict()}

    def aligned(spec: SymmetrySpec, pa: Params, pb: Params, method: str) -> dict[str, Any]:
        if method == "weight":
            result = weight_matching(spec, pa, pb)
        elif method == "weight, best start":
            chosen = WeightMatchingConfig(start="best")
            result = weight_matching(spec, pa, pb, chosen, model=module, data=data)
        elif method == "learned":
            learned = LearnedMatchingConfig(
                steps=config.learned_steps, batch_size=config.batch_size, lr=config.learned_lr
            )
            result = learned_matching(spec, pa, pb, learned, model=module, data=data)
        else:
            am = ActivationMatchingConfig(batches=config.stat_batches, statistic="natural")
            result = activation_matching(spec, pa, pb, am, model=module, data=data)
        entry = path(pa, apply(spec, pb, result.transform), method=method)
        return entry | {"align_seconds": result.seconds, "sweeps": result.iterations}

    perm = aligned_form(module, a, b, symmetry="permutation")
    orth = aligned_form(module, a, b, symmetry="orthogonal")
    stages = {
        "vanilla": lambda: path(a, b),
        "vanilla (norm scales folded)": lambda: path(orth.a, orth.b),
        "WM permutations": lambda: aligned(perm.spec, a, b, "weight"),
        "WM orthogonal residual": lambda: aligned(orth.spec, orth.a, orth.b, "weight"),
        "AM permutations": lambda: aligned(perm.spec, a, b, "activation"),
        "AM orthogonal residual": lambda: aligned(orth.spec, orth.a, orth.b, "activation"),
        "WM orthogonal, best start": lambda: aligned(
            orth.spec, orth.a, orth.b, "weight, best start"
        ),
        "learned orthogonal": lambda: aligned(orth.spec, orth.a, orth.b, "learned"),
    }
    rows = [_row(name, run.stage(_stage_name(name), fn)) for name, fn in stages.items()]
    table = _format(rows, orth.spec)
    return run.result(table, rows, [], f"residual group after folding: {orth.form}")


def _stage_name(name: str) -> str:
    return name.lower().replace(" ", "-").replace("(", "").replace(")", "")


def _format(rows: list[dict[str, Any]], spec: SymmetrySpec) -> str:
    lines = [f"{'method':<30}{'loss barrier':>14}{'mid loss':>10}{'end losses':>18}"]
    for r in rows:
        ends = "/".join(f"{x:.3f}" for x in r["end_losses"])
        lines.append(f"{r['method']:<30}{r['loss_barrier']:>14.4f}{r['mid_loss']:>10.4f}{ends:>18}")
    groups = ", ".join(f"{s.name}: {type(s.group).__name__}" for s in list(spec)[:3])
    return "\n".join([*lines, f"(inferred spaces, first three: {groups}, ...)"])
