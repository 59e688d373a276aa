"""GPT-2 on Tiny Shakespeare (BPE): the paper's full barrier table in one run.

Generalized LMC for Transformers (2025), GPT-2 table. Models are trained (and cached
as checkpoints under ``out_dir``), then the linear path between two of them is measured
on the *test* split (``t`` in steps of 0.1, token cross-entropy) after each alignment:

* ``vanilla``: no alignment (the LayerNorm models as trained); every other row
  interpolates both models rewritten to RMSNorm form
  (:func:`lmckit.forms.layernorm_to_rmsnorm`, exact), so ``vanilla (RMS form)`` is
  their unaligned baseline;
* ``activation matching``: permutations of residual stream, heads and MLP units from
  activation correlations; ``(orthogonal), circuit form``: on the circuit forms (below),
  the residual stream by Procrustes on its cross-covariance, heads by their attention
  patterns, MLP units by correlation;
* ``WM (permutations only)`` / ``learned (permutations only)``: the residual stream
  permuted (``spec.with_groups(residual=Permutation())``), heads by QK/OV circuits;
* ``WM (orthogonal)`` / ``learned (orthogonal)``: the residual stream aligned by an
  orthogonal map; ``+ head bases``: then each matched head's query/key and value/output
  bases aligned by orthogonal maps (:func:`lmckit.aligners.match_head_bases`, data-free);
* ``..., circuit form``: both RMSNorm models with every head rewritten as its QK and OV
  circuit (:func:`lmckit.forms.heads_to_circuits`, exact), weight-matched and
  interpolated in that form, embedding and LM-head rows weighted by their tokens'
  training frequency (``unweighted tokens``: the ablation). The paper's code merges
  heads so (it "multiplies out" the within-head maps, and computes token frequencies),
  so these rows carry its numbers and the targets;
* width-heterogeneous: the narrow model embedded exactly into the wide one's shape
  (:func:`lmckit.forms.embed_in_wider`), then orthogonal WM (and learned matching)
  with the wide model as reference;
* three models: the multi-model barrier over the simplex, unaligned vs universe
  matching (RMSNorm forms, orthogonal residual maps; also in circuit form), with the
  triangle figure.

Weight matching (also as learned matching's start and inside universe matching) ignores
embedding/LM-head rows of tokens absent from the training split
(as the reference code does). Weight and activation matching run on the CPU (the solvers
are SciPy/NumPy); training, learned matching's forward and backward passes and path
evaluation run on the runner's device (``cuda`` when it is available, training with
TF32 matrix products, everything measured in full float32). Every stage's result is
cached beside the checkpoints (:mod:`lmckit.experiments._runner`), so an interrupted run
continues where it stopped. Stages: :mod:`.stages`; config and reference numbers:
:mod:`.config`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmckit.data import Dataset
from lmckit.data._token_stats import seen_token_masks, text_prefix, token_row_weights
from lmckit.experiments._gpt2_shakespeare.config import (
    PAPER,
    PAPER_NUMBERS,
    PATH_FIGURE_ROWS,
    REFERENCE_NUMBERS,
    TARGETS,
    GPT2ShakespeareConfig,
    paper_config,
    quick_config,
)
from lmckit.experiments._gpt2_shakespeare.simplex import simplex_stages
from lmckit.experiments._gpt2_shakespeare.stages import Bench, pair_stages, width_stages
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.measure._evaluate import PathResult
from lmckit.measure._plot import plot_paths, plot_simplex
from lmckit.measure._table import Column, format_table, percent
from lmckit.models import ZooModel, create_model
from lmckit.paths import SimplexResult
from lmckit.symmetry._params import Params

__all__ = ["gpt2_shakespeare", "run_gpt2_shakespeare", "shakespeare_tokens"]


def shakespeare_tokens(
    text: str | Path, tokenizer: str | Path, *, block: int, tokens: int | None = None
) -> Dataset:
    """Tiny Shakespeare in GPT-2 BPE blocks (:func:`lmckit.data._token_stats.text_prefix`)."""
    return text_prefix(text, tokenizer, block=block, tokens=tokens, name="tinyshakespeare")


# --------------------------------------------------------------------------- table

COLUMNS = (
    Column("method", "method", align="<"),
    Column("loss barrier", "barrier_loss", ".4f", missing="n/a"),
    percent("acc barrier", "barrier_acc"),
    Column("paper", "paper"),
    Column("reference code", "reference"),
    Column("target", "target"),
    Column("align s", "align_seconds", ".1f"),
    Column("stage s", "stage_seconds", ".1f"),
)


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
            "centroid_loss": res.centroid_loss if res.has_centroid else None,
        }
    path = PathResult.from_dict(entry["path"])
    extra = {k: entry[k] for k in ("sweeps", "steps", "embed_max_logit_diff") if k in entry}
    measured: dict[str, Any] = {
        "barrier_loss": path.barrier_loss,
        "barrier_acc": path.barrier_acc,
        "mid_loss": path.midpoint_loss,
        "end_losses": [path.loss[0], path.loss[-1]],
        "loss": path.loss,
    }
    return row | measured | extra


# --------------------------------------------------------------------------- experiment


def _gpt2(
    run: Runner, data: Dataset, config: GPT2ShakespeareConfig, seed: int, **arch: Any
) -> tuple[ZooModel, Params]:
    """One LayerNorm GPT-2 trained on ``data`` (or reloaded from the run's cache)."""
    module, params = run.train(
        f"gpt2-{arch['n_embd']}-seed{seed}",
        lambda: create_model("gpt2", seed=seed, **arch),
        data,
        config.train,
        seed=seed,
    )
    return module, params  # type: ignore[return-value]


def run_gpt2_shakespeare(ctx: ExperimentContext, config: GPT2ShakespeareConfig) -> ExperimentResult:
    """The whole pipeline for ``config`` (see the module docstring)."""
    run = Runner(ctx, config, label="quick" if ctx.quick else "paper")
    data = _tokens(ctx, config, run)
    arch: dict[str, Any] = {
        "vocab_size": data.num_classes,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "n_inner": config.n_inner,
        "context": config.context,
        "dropout": config.dropout,
    }
    s = ctx.seed
    ln, a = _gpt2(run, data, config, s, **arch)
    _, b = _gpt2(run, data, config, s + 1, **arch)
    _, c = _gpt2(run, data, config, s + 2, **arch)
    # the wide model's eps is the narrow one's times n/m: embed_in_wider rescales eps so,
    # and the embedded and wide models must be one architecture to be interpolated
    wide_arch = arch | {
        "n_embd": config.wide_embd,
        "n_inner": config.wide_inner,
        "layer_norm_epsilon": 1e-5 * config.n_embd / config.wide_embd,
    }
    wide_ln, wide = _gpt2(run, data, config, s + 1, **wide_arch)

    bench = Bench(run, config, data, seen_token_masks(data), token_row_weights(data))
    # the data-free stages first, so that a run cut short has them all cached; the
    # second pass loads them and adds the learned rows
    for learned in (False, True):
        entries = pair_stages(bench, ln, a, b, learned=learned)
        entries |= width_stages(bench, ln, a, wide_ln, wide, learned=learned)
        entries |= simplex_stages(bench, ln, [a, b, c])

    width = f"{config.wide_embd} vs {config.n_embd}"
    rows = [_row(name, e, name.replace("512 vs 256", width)) for name, e in entries.items()]
    notes = f"models: {json.dumps(run.model_metadata())}"
    return run.result(format_table(rows, COLUMNS), rows, _figures(ctx, entries), notes)


def _tokens(ctx: ExperimentContext, config: GPT2ShakespeareConfig, run: Runner) -> Dataset:
    """Tiny Shakespeare in blocks of the config's context, its sizes logged."""
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
    return data


def _figures(ctx: ExperimentContext, entries: dict[str, dict[str, Any]]) -> list[Path]:
    """The test loss along the linear paths of the figure's rows, and over the simplex."""
    s = ctx.seed
    return [
        plot_paths(
            {k: PathResult.from_dict(entries[k]["path"]) for k in PATH_FIGURE_ROWS if k in entries},
            ctx.out_dir / "gpt2_shakespeare_paths.png",
            title="GPT-2 on Tiny Shakespeare: test loss along the linear path",
            overwrite=True,  # inside lmckit's own experiment folder
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
            overwrite=True,
        ),
    ]


@register_experiment("gpt2-shakespeare", paper=PAPER)
def gpt2_shakespeare(ctx: ExperimentContext) -> ExperimentResult:
    """GPT-2 on Tiny Shakespeare (BPE): vanilla / AM / WM / learned / width / simplex barriers."""
    config = quick_config() if ctx.quick else paper_config()
    return run_gpt2_shakespeare(ctx, config)
