"""Transformers under generalized symmetries (Generalized LMC for Transformers, 2025).

Two independently trained transformers are aligned by data-free weight matching and
by activation matching, and the linear path between them is measured (test split,
11 points):

* ``vanilla``: no alignment, the LayerNorm models as trained;
* ``WM permutation``: residual stream, heads (by QK/OV circuits) and MLP units
  permuted, on the LayerNorm models (their norm parameters move with the units);
* ``WM orthogonal``: both models rewritten to RMSNorm form
  (:func:`lmckit.forms.layernorm_to_rmsnorm`, exact), the residual stream
  aligned by an orthogonal map, heads and MLP units by permutations;
* ``WM orthogonal + head bases``: that solution, then each matched head's query/key
  and value/output bases aligned by orthogonal maps
  (:func:`lmckit.aligners.head_bases_matching`; still data-free, same function);
* ``WM orthogonal (circuit form)``: the RMSNorm forms with every head rewritten as its
  QK and OV circuit (:func:`lmckit.forms.heads_to_circuits`, exact), weight-matched
  and interpolated in that form, as the paper's code merges heads;
* ``AM permutation``: activation matching of the LayerNorm models (Pearson
  correlation of residual-stream, per-head-unit and MLP activations; permutations);
* ``AM permutation (units in heads)``: the same with the units inside each head also
  permuted (:func:`units_in_heads`);
* ``AM orthogonal``: activation matching of the RMSNorm forms, the residual stream by
  Procrustes on its cross-covariance, heads and MLP units by correlation;
  ``(circuit form)``: the same on the circuit forms, heads by their attention patterns;
* ``learned orthogonal`` (and ``(circuit form)``): learned matching from the orthogonal
  weight-matching solution (straight-through permutations, SVD-projected residual map).

For reference the RMSNorm forms are also measured unaligned and with permutations
only (interpolating folded norm scales is not the same path as interpolating them).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from lmckit.aligners import (
    ActivationMatchingConfig,
    LearnedMatchingConfig,
    WeightMatchingConfig,
    activation_matching,
    head_bases_matching,
    learned_matching,
    weight_matching,
)
from lmckit.data import Dataset
from lmckit.data._token_stats import EMBEDDING, LM_HEAD, token_counts
from lmckit.experiments._datasets import char_dataset, mnist_subset
from lmckit.experiments._recipe import transformer_form
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.experiments._tables import path_row
from lmckit.measure._evaluate import PathResult
from lmckit.measure._measure import EvalSettings, measure_path, path_table
from lmckit.models import ZooModel, create_model
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import HeadPermutation, Permutation, SymmetrySpec, apply
from lmckit.training._train import TrainConfig

__all__ = [
    "char_dataset",
    "compare_transformer_alignments",
    "units_in_heads",
]

PAPER = "Generalized linear mode connectivity for transformers (2025)"


def compare_transformer_alignments(
    module: ZooModel,
    params_a: Params,
    params_b: Params,
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    row_masks: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
    activations: bool = True,
    learned: LearnedMatchingConfig | None = None,
) -> dict[str, PathResult]:
    """Paths between two LayerNorm transformers: vanilla, permutation/orthogonal WM and AM.

    Args:
        module: a ``norm="layer"`` GPT-2 or ViT.
        params_a, params_b: the two trained models.
        data: evaluated on ``settings.split``.
        row_masks: passed to weight matching (e.g. embedding rows of seen tokens).
        activations: also run activation matching on the first ``settings.stat_batches``
            training batches (the ``AM ...`` rows).
        learned: also run orthogonal learned matching with this config, in the RMSNorm
            and the circuit form (the ``learned ...`` rows; on ``data``'s training split).

    Returns:
        Path results keyed by method (see the module docstring).
    """
    settings = settings or EvalSettings(fix="none")
    config = WeightMatchingConfig(max_iter=100)
    out: dict[str, PathResult] = {}
    out["vanilla"] = measure_path(module, params_a, params_b, data, settings)
    spec = module.symmetry_spec()
    masks = _masks_for(params_a, row_masks)
    perm = weight_matching(spec, params_a, params_b, config, seed=seed, row_masks=masks)
    out["WM permutation"] = measure_path(
        module, params_a, apply(spec, params_b, perm.transform), data, settings
    )
    rms, rms_a = transformer_form(module, params_a)
    _, rms_b = transformer_form(module, params_b)
    rms_spec = rms.symmetry_spec()
    rms_masks = _masks_for(rms_a, row_masks)
    out["vanilla (RMS form)"] = measure_path(rms, rms_a, rms_b, data, settings)
    for label, use_spec in (
        ("WM permutation (RMS)", rms_spec.with_groups(residual=Permutation())),
        ("WM orthogonal", rms_spec),
    ):
        result = weight_matching(use_spec, rms_a, rms_b, config, seed=seed, row_masks=rms_masks)
        moved = apply(use_spec, rms_b, result.transform)
        out[label] = measure_path(rms, rms_a, moved, data, settings)
    # the same orthogonal solution, then each matched head's bases aligned too
    based = head_bases_matching(rms_spec, rms_a, moved).apply(moved)
    out["WM orthogonal + head bases"] = measure_path(rms, rms_a, based, data, settings)
    # heads as QK/OV circuits: no inner bases left, the path interpolates circuits
    circuits, circ_a = transformer_form(rms, rms_a, circuits=True)
    _, circ_b = transformer_form(rms, rms_b, circuits=True)
    circ_spec = circuits.symmetry_spec()
    result = weight_matching(circ_spec, circ_a, circ_b, config, seed=seed, row_masks=rms_masks)
    moved = apply(circ_spec, circ_b, result.transform)
    out["WM orthogonal (circuit form)"] = measure_path(circuits, circ_a, moved, data, settings)
    forms = {
        "layer": (module, spec, params_a, params_b),
        "rms": (rms, rms_spec, rms_a, rms_b),
        "circuits": (circuits, circ_spec, circ_a, circ_b),
    }
    if activations:
        out |= _activation_rows(forms, data, settings)
    if learned is not None:
        out |= _learned_rows(forms, data, settings, learned, seed=seed, row_masks=rms_masks)
    return out


#: A form of the pair: its module, spec and both models' parameters.
_Form = tuple[torch.nn.Module, SymmetrySpec, Params, Params]


def _activation_rows(
    forms: dict[str, _Form], data: Dataset, settings: EvalSettings
) -> dict[str, PathResult]:
    """The ``AM ...`` rows: activation matching on the first ``stat_batches`` training
    batches; Pearson correlation, or each space's natural statistic (covariance for an
    orthogonal residual stream)."""
    am = ActivationMatchingConfig(
        batch_size=settings.batch_for(data), batches=settings.stat_batches
    )
    natural = replace(am, statistic="natural")
    module, spec, pa, pb = forms["layer"]
    rows = {
        "AM permutation": (forms["layer"], am),
        "AM permutation (units in heads)": ((module, units_in_heads(spec), pa, pb), am),
        "AM orthogonal": (forms["rms"], natural),
        # circuit heads are matched by their attention patterns
        "AM orthogonal (circuit form)": (forms["circuits"], natural),
    }
    out = {}
    for label, ((form, use_spec, a, b), config) in rows.items():
        res = activation_matching(use_spec, a, b, config, model=form, data=data)
        out[label] = measure_path(form, a, res.apply(b), data, settings)
    return out


def _learned_rows(
    forms: dict[str, _Form],
    data: Dataset,
    settings: EvalSettings,
    config: LearnedMatchingConfig,
    *,
    seed: int,
    row_masks: dict[str, torch.Tensor] | None,
) -> dict[str, PathResult]:
    """The ``learned ...`` rows: orthogonal learned matching in the RMSNorm and the
    circuit form, on ``data``'s training split."""
    out = {}
    for label, key in (
        ("learned orthogonal", "rms"),
        ("learned orthogonal (circuit form)", "circuits"),
    ):
        form, use_spec, a, b = forms[key]
        res = learned_matching(
            use_spec, a, b, config, model=form, data=data, seed=seed, row_masks=row_masks
        )
        out[label] = measure_path(form, a, apply(use_spec, b, res.transform), data, settings)
    return out


def units_in_heads(spec: SymmetrySpec) -> SymmetrySpec:
    """``spec`` with each head space's group widened to ``Permutation(blocks=heads)``.

    Heads are permuted *and* the ``head_dim`` units inside each head are permuted (the
    same permutation for its query, key and value rows and output columns), a subgroup
    of the within-head symmetry that the head circuits cannot see but interpolation
    does. Only activation matching (or plain-weight matching) can solve it. The spaces
    nested in those heads (bases inside each head) are left out: this permutation of
    units stands in for them.
    """
    groups = {
        s.name: Permutation(blocks=s.group.heads)
        for s in spec
        if isinstance(s.group, HeadPermutation)
    }
    kept = tuple(s for s in spec if s.nest is None or s.nest.parent not in groups)
    return SymmetrySpec(kept, spec.meta).with_groups(**groups)


def _masks_for(
    params: Params, masks: dict[str, torch.Tensor] | None
) -> dict[str, torch.Tensor] | None:
    return None if masks is None else {k: v for k, v in masks.items() if k in params}


def _result(run: Runner, results: dict[str, PathResult], notes: str) -> ExperimentResult:
    rows = [path_row(name, r) for name, r in results.items()]
    return run.result(path_table(results), rows, notes=notes)


# --------------------------------------------------------------------------- ViT on MNIST


@register_experiment("vit-mnist", paper=PAPER)
def vit_mnist(ctx: ExperimentContext) -> ExperimentResult:
    """ViT on MNIST: barrier of vanilla > permutation WM > orthogonal WM."""
    if ctx.quick:
        data = mnist_subset(ctx, train_size=1000, test_size=500)
        arch = {"width": 16, "depth": 1, "heads": 2, "mlp_dim": 32}
        config = TrainConfig(epochs=1, batch_size=64, optimizer="adamw", lr=2e-3)
    else:
        data = mnist_subset(ctx)
        arch = {"width": 64, "depth": 2, "heads": 4, "mlp_dim": 128}
        config = TrainConfig(
            epochs=8, batch_size=128, optimizer="adamw", lr=1e-3, weight_decay=0.01, warmup=0.05
        )
    learned = LearnedMatchingConfig(
        steps=30 if ctx.quick else 300, batch_size=128, eval_every=10 if ctx.quick else 50
    )
    kwargs = {"image_size": 28, "patch_size": 7, "in_channels": 1, "num_classes": 10}
    kwargs.update(arch)
    run = Runner(ctx, {"model": kwargs, "train": config, "learned": learned})
    ctx.log(f"training ViTs {arch} on MNIST")
    module, a, b = run.train_pair(
        "vit", lambda seed: create_model("vit", seed=seed, **kwargs), data, config
    )
    ctx.log("aligning and measuring paths")
    results = compare_transformer_alignments(
        module, a, b, data, EvalSettings(fix="none"), seed=ctx.seed, learned=learned
    )
    return _result(run, results, str(kwargs))


# --------------------------------------------------------------------------- GPT-2 on chars


@register_experiment("gpt2-chars", paper=PAPER)
def gpt2_chars(ctx: ExperimentContext) -> ExperimentResult:
    """Tiny GPT-2s on characters of Tiny Shakespeare: vanilla vs permutation vs orthogonal WM."""
    path = ctx.data("tinyshakespeare") / "input.txt"
    if ctx.quick:
        data = char_dataset(path, chars=40_000, block=32)
        arch = {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_inner": 64, "context": 32}
        config = TrainConfig(epochs=1, batch_size=32, optimizer="adamw", lr=3e-3)
    else:
        data = char_dataset(path, chars=100_000, block=64)
        arch = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_inner": 128, "context": 64}
        config = TrainConfig(
            epochs=2, batch_size=32, optimizer="adamw", lr=3e-3, weight_decay=0.01, warmup=0.05
        )
    kwargs = {"vocab_size": data.num_classes, **arch}
    run = Runner(ctx, {"model": kwargs, "train": config, "chars": len(data.x_train)})
    ctx.log(f"training GPT-2s {arch} on characters")
    module, a, b = run.train_pair(
        "gpt2", lambda seed: create_model("gpt2", seed=seed, **kwargs), data, config
    )
    ctx.log("aligning and measuring paths")
    results = compare_transformer_alignments(
        module,
        a,
        b,
        data,
        EvalSettings(fix="none", batch_size=256),
        # rows of characters never read in training carry no signal
        row_masks=dict.fromkeys((EMBEDDING, LM_HEAD), token_counts(data)[0] > 0),
        seed=ctx.seed,
    )
    return _result(run, results, str(kwargs))
