"""The simplex stage of the GPT-2 / Tiny Shakespeare experiment: three models over their
simplex (RMSNorm forms), unaligned vs universe matching (in the RMSNorm and the circuit
form, with and without head bases)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lmckit.aligners import UniverseConfig, head_bases_matching, universe_matching
from lmckit.experiments._gpt2_shakespeare.stages import Bench, masks_for
from lmckit.experiments._recipe import transformer_form
from lmckit.models import ZooModel
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import SymmetrySpec

__all__ = ["simplex_stages"]


def simplex_stages(bench: Bench, ln: ZooModel, models: list[Params]) -> dict[str, dict[str, Any]]:
    """Three models over their simplex (RMSNorm forms): unaligned vs universe matching."""
    rms_models = []
    rms = ln
    for p in models:
        rms, q = transformer_form(ln, p)
        rms_models.append(q)

    def unaligned() -> dict[str, Any]:
        return {"simplex": bench.simplex(rms, rms_models).to_dict()}

    out = {
        "3 models: unaligned": bench.run.stage("simplex-unaligned", unaligned),
        "3 models: universe matching": bench.run.stage(
            "simplex-universe", lambda: _universe(bench, rms, rms_models)
        ),
        "3 models: universe matching, circuit form": bench.run.stage(
            "simplex-universe-circuits-freq", lambda: _universe_circuits(bench, rms, rms_models)
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


def _universe_in(
    bench: Bench,
    spec: SymmetrySpec,
    models: list[Params],
    weights: dict[str, Tensor] | None = None,
) -> tuple[dict, list[Params]]:
    """Universe matching of ``models`` under ``spec``: its timing and the aligned models."""
    res = universe_matching(
        spec,
        models[0],
        models[1],
        UniverseConfig(max_iter=bench.config.universe_sweeps, inner=bench.config.weight),
        others=models[2:],
        seed=bench.run.ctx.seed,
        row_masks=masks_for(models[0], bench.masks),
        row_weights=None if weights is None else masks_for(models[0], weights),
    )
    timing = {"align_seconds": res.seconds, "sweeps": res.iterations}
    return timing | {"converged": res.converged}, res.aligned(spec, models)


def _universe(bench: Bench, rms: ZooModel, rms_models: list[Params]) -> dict[str, Any]:
    """The simplex of the universe-matched models, and of them with every model's head
    bases aligned to the first model's (outside the spec)."""
    spec = rms.symmetry_spec()
    timing, aligned = _universe_in(bench, spec, rms_models)
    first = aligned[0]
    based = [first] + [head_bases_matching(spec, first, p).apply(p) for p in aligned[1:]]
    return {
        "simplex": bench.simplex(rms, aligned).to_dict(),
        "head_bases_simplex": bench.simplex(rms, based).to_dict(),
        **timing,
    }


def _universe_circuits(bench: Bench, rms: ZooModel, rms_models: list[Params]) -> dict[str, Any]:
    """The simplex of the models universe-matched in the circuit form, rows weighted by
    token frequency."""
    circuits, circ_models = rms, []
    for p in rms_models:
        circuits, q = transformer_form(rms, p, circuits=True)
        circ_models.append(q)
    spec = circuits.symmetry_spec()
    timing, aligned = _universe_in(bench, spec, circ_models, bench.weights)
    return {"simplex": bench.simplex(circuits, aligned).to_dict(), **timing}
