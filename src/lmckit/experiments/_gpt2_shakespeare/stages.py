"""The stages of the GPT-2 / Tiny Shakespeare experiment: pairs, width pair, simplex.

Each stage aligns (or not) and measures one row; the runner caches its JSON, so a run
cut short continues where it stopped. Weight and activation matching run on the CPU;
path evaluation and learned matching's passes on the runner's device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from lmckit.aligners import (
    ActivationMatchingConfig,
    AlignmentResult,
    WeightMatchingConfig,
    activation_matching,
    head_bases_matching,
    learned_matching,
    weight_matching,
)
from lmckit.data import Dataset
from lmckit.experiments._gpt2_shakespeare.config import GPT2ShakespeareConfig
from lmckit.experiments._recipe import transformer_form
from lmckit.experiments._runner import Runner
from lmckit.forms._widen import embed_in_wider
from lmckit.measure._evaluate import PathResult
from lmckit.models import ZooModel
from lmckit.paths import SimplexResult
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import Permutation, SymmetrySpec, apply

__all__ = ["Bench", "masks_for", "pair_stages", "width_stages"]


@dataclass(frozen=True)
class Bench:
    """What every stage works with.

    Attributes:
        run: the runner (cache, device, seed).
        config: the experiment's config.
        data: the token data; paths are measured on its test split.
        masks: embedding / LM-head rows of the tokens seen in training (``row_masks``).
        weights: those rows weighted by token frequency (``row_weights``).
    """

    run: Runner
    config: GPT2ShakespeareConfig
    data: Dataset
    masks: dict[str, Tensor]
    weights: dict[str, Tensor]

    def path(self, module: ZooModel, a: Params, b: Params) -> PathResult:
        """The test loss along the linear path (``config.points`` points)."""
        x, y = self.data.split("test")
        return self.run.path(
            module, a, b, x, y, batch_size=self.config.eval_batch_size, points=self.config.points
        )

    def simplex(self, module: ZooModel, models: list[Params]) -> SimplexResult:
        """The test loss over the simplex of ``models``."""
        x, y = self.data.split("test")
        return self.run.simplex(
            module,
            models,
            x,
            y,
            batch_size=self.config.eval_batch_size,
            resolution=self.config.simplex_resolution,
        )


def masks_for(params: Params, masks: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v for k, v in masks.items() if k in params}


def _path_entry(result: PathResult, **extra: Any) -> dict[str, Any]:
    return {"path": result.to_dict(), **extra}


def _wm_entry(
    bench: Bench,
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
        config or bench.config.weight,
        seed=bench.run.ctx.seed,
        row_masks=masks_for(pa, bench.masks),
        row_weights=None if weights is None else masks_for(pa, weights),
    )
    moved = apply(spec, pb, res.transform)
    if head_bases:
        moved = head_bases_matching(spec, pa, moved).apply(moved)
    return _path_entry(
        bench.path(module, pa, moved),
        align_seconds=res.seconds,
        sweeps=res.iterations,
        converged=res.converged,
    )


def _learn(
    bench: Bench,
    spec: SymmetrySpec,
    module: ZooModel,
    pa: Params,
    pb: Params,
) -> tuple[AlignmentResult, Params]:
    """Learned matching of ``pb`` to ``pa`` with the run's settings, and ``pb`` moved."""
    assert bench.config.learned is not None
    run = bench.run
    res = learned_matching(
        spec,
        pa,
        pb,
        bench.config.learned,
        model=module,
        data=bench.data,
        seed=run.ctx.seed,
        device=run.device,
        progress=run.ctx.progress,
        row_masks=masks_for(pa, bench.masks),
    )
    return res, apply(spec, pb, res.transform)


#: A form of the pair: its module and both models' parameters.
_Form = tuple[ZooModel, Params, Params]


def pair_stages(
    bench: Bench, ln: ZooModel, a: Params, b: Params, *, learned: bool
) -> dict[str, dict[str, Any]]:
    """Every two-model row: vanilla, activation, weight and (with ``learned``) learned
    matching."""
    run = bench.run
    rms, rms_a = transformer_form(ln, a)
    _, rms_b = transformer_form(ln, b)
    circuits, circ_a = transformer_form(rms, rms_a, circuits=True)
    _, circ_b = transformer_form(rms, rms_b, circuits=True)
    out: dict[str, dict[str, Any]] = {}
    out["vanilla"] = run.stage("vanilla", lambda: _path_entry(bench.path(ln, a, b)))
    out["vanilla (RMS form)"] = run.stage(
        "vanilla-rms", lambda: _path_entry(bench.path(rms, rms_a, rms_b))
    )
    rms_form, circuit_form = (rms, rms_a, rms_b), (circuits, circ_a, circ_b)
    out |= _activation_stages(bench, rms_form, circuit_form)
    out |= _weight_matching_stages(bench, rms_form, circuit_form)
    if bench.config.learned is not None and learned:
        out |= _learned_stages(bench, rms_form)
    return out


def _activation_stages(bench: Bench, rms_form: _Form, circuit_form: _Form) -> dict[str, Any]:
    """Activation matching on the first ``stat_batches`` training batches (Pearson
    correlation), permutations in the RMSNorm form and orthogonal in the circuit form."""
    cfg, data = bench.config, bench.data
    (rms, rms_a, rms_b), (circuits, circ_a, circ_b) = rms_form, circuit_form
    perm_spec = rms.symmetry_spec().with_groups(residual=Permutation())
    circ_spec = circuits.symmetry_spec()
    am = ActivationMatchingConfig(batch_size=cfg.eval_batch_size, batches=cfg.stat_batches)

    def activation() -> dict[str, Any]:
        res = activation_matching(perm_spec, rms_a, rms_b, am, model=rms, data=data)
        moved = res.apply(rms_b)
        return _path_entry(bench.path(rms, rms_a, moved), align_seconds=res.seconds)

    def activation_circuits() -> dict[str, Any]:
        # residual by Procrustes on the streams' cross-covariance, heads by their
        # attention patterns, MLP units by correlation
        natural = replace(am, statistic="natural")
        res = activation_matching(circ_spec, circ_a, circ_b, natural, model=circuits, data=data)
        moved = res.apply(circ_b)
        return _path_entry(bench.path(circuits, circ_a, moved), align_seconds=res.seconds)

    return {
        "activation matching": bench.run.stage("activation", activation),
        "activation matching (orthogonal), circuit form": bench.run.stage(
            "activation-orth-circuits", activation_circuits
        ),
    }


def _weight_matching_stages(bench: Bench, rms_form: _Form, circuit_form: _Form) -> dict[str, Any]:
    """Weight matching: permutations only (the ablation) and orthogonal in the RMSNorm
    form, with head bases and with raw head weights; both in the circuit form, tokens
    weighted by frequency (as the reference code's token_freqs) and not."""
    run, cfg = bench.run, bench.config
    (rms, rms_a, rms_b), (circuits, circ_a, circ_b) = rms_form, circuit_form
    orth_spec = rms.symmetry_spec()  # residual: Orthogonal (RMSNorm commutes with it)
    perm_spec = orth_spec.with_groups(residual=Permutation())
    circ_spec = circuits.symmetry_spec()
    circ_perm_spec = circ_spec.with_groups(residual=Permutation())

    def wm(spec: SymmetrySpec, **options: Any) -> dict[str, Any]:
        return _wm_entry(bench, spec, rms, rms_a, rms_b, **options)

    out: dict[str, Any] = {}
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
    weights = bench.weights
    for label, stage, spec, use in (
        ("permutations only", "wm-perm-circuits-freq", circ_perm_spec, weights),
        ("orthogonal", "wm-orth-circuits-freq", circ_spec, weights),
        ("orthogonal", "wm-orth-circuits", circ_spec, None),
    ):
        name = f"WM ({label}), circuit form" + ("" if use else ", unweighted tokens")
        compute = partial(_wm_entry, bench, spec, circuits, circ_a, circ_b, weights=use)
        out[name] = run.stage(stage, compute)
    return out


def _learned_stages(bench: Bench, rms_form: _Form) -> dict[str, Any]:
    """Learned matching in the RMSNorm form, permutations only and orthogonal; the
    orthogonal solution with the heads' inner bases matched afterwards is a row too."""
    run = bench.run
    rms, rms_a, rms_b = rms_form
    orth_spec = rms.symmetry_spec()
    perm_spec = orth_spec.with_groups(residual=Permutation())

    def learn(spec: SymmetrySpec, module: ZooModel, pa: Params, pb: Params) -> dict:
        res, moved = _learn(bench, spec, module, pa, pb)
        # the heads' inner bases are outside the spec, so learning cannot move them:
        # aligned afterwards, the same path with them matched is a second row
        based = head_bases_matching(spec, pa, moved).apply(moved)
        return _path_entry(
            bench.path(module, pa, moved),
            align_seconds=res.seconds,
            steps=res.iterations,
            val_mid_loss=[res.history[0], min(res.history)],
            head_bases_path=bench.path(module, pa, based).to_dict(),
        )

    out: dict[str, Any] = {}
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


def width_stages(
    bench: Bench, ln: ZooModel, a: Params, wide_ln: ZooModel, wide: Params, *, learned: bool
) -> dict[str, dict[str, Any]]:
    """The narrow model (``a``) embedded into the wide one's shape, then aligned to it
    (with ``learned``, also by learned matching)."""
    run, cfg = bench.run, bench.config
    rms, rms_a = transformer_form(ln, a)
    wide_rms, rms_wide = transformer_form(wide_ln, wide)
    emb_module, emb = _embedded(cfg, rms, rms_a, wide_rms)
    exact = _embedding_error(emb_module, emb, rms, rms_a, bench.data.x_test)
    spec = wide_rms.symmetry_spec()
    out: dict[str, dict[str, Any]] = {}
    out["width 512 vs 256: vanilla (embedded)"] = run.stage(
        "width-vanilla",
        lambda: _path_entry(bench.path(wide_rms, rms_wide, emb), embed_max_logit_diff=exact),
    )

    def wm(head_bases: bool = False) -> dict[str, Any]:
        return _wm_entry(bench, spec, wide_rms, rms_wide, emb, head_bases=head_bases)

    out["width 512 vs 256: WM (orthogonal)"] = run.stage("width-wm-orth", wm)
    out["width 512 vs 256: WM (orthogonal) + head bases"] = run.stage(
        "width-wm-orth-bases", lambda: wm(head_bases=True)
    )

    def wm_circuits() -> dict[str, Any]:
        circuits, circ_wide = transformer_form(wide_rms, rms_wide, circuits=True)
        _, circ_emb = transformer_form(emb_module, emb, circuits=True)
        spec = circuits.symmetry_spec()
        return _wm_entry(bench, spec, circuits, circ_wide, circ_emb, weights=bench.weights)

    out["width 512 vs 256: WM (orthogonal), circuit form"] = run.stage(
        "width-wm-orth-circuits-freq", wm_circuits
    )
    if cfg.learned is not None and cfg.learned_width and learned:

        def learn() -> dict[str, Any]:
            res, moved = _learn(bench, spec, wide_rms, rms_wide, emb)
            return _path_entry(
                bench.path(wide_rms, rms_wide, moved),
                align_seconds=res.seconds,
                steps=res.iterations,
            )

        out["width 512 vs 256: learned (orthogonal)"] = run.stage("width-learned-orth", learn)
    return out


def _embedded(
    cfg: GPT2ShakespeareConfig, rms: ZooModel, rms_a: Params, wide_rms: ZooModel
) -> tuple[ZooModel, Params]:
    """The narrow model embedded exactly into the wide one's shape (the first columns of
    the identity: alignment finds the rotation); refused if the architectures differ."""
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
    return emb_module, emb


def _embedding_error(
    emb_module: ZooModel, emb: Params, rms: ZooModel, rms_a: Params, x_test: Tensor
) -> float:
    """The largest logit difference between the embedded and the narrow model on a few
    test sequences (an exact embedding: rounding only)."""
    x = x_test[: min(4, len(x_test))]
    emb_module.eval()  # dropout off: the check compares functions
    rms.eval()
    with torch.no_grad():
        return float(
            (
                torch.func.functional_call(emb_module, emb, (x,))
                - torch.func.functional_call(rms, rms_a, (x,))
            )
            .abs()
            .max()
        )
