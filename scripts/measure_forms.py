"""Which form and start give the lowest barrier: the measurements behind lmckit's defaults.

For one pair of models (lmckit checkpoints or Hugging Face folders) and one dataset, runs
``lmckit.plan.plan_alignment`` (run on B) for every symmetry, form (``lmckit.forms.FORMS``) and
weight-matching start, with unseen-token masks, and measures the test-loss barrier of
each result on both paths (heads interpolated as projections where the form allows, and
as QK/OV circuits). ``lmckit.forms._choice.PREFERRED_FORMS`` and the command line's ``--start``
default are read off these tables (``docs/experiments/reference_comparison.md``).

    nice -n 10 .venv/bin/python scripts/measure_forms.py A B --data SPEC --json out.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from lmckit.aligners import WeightMatchingConfig
from lmckit.data import load_data
from lmckit.formats._io import LoadedModel, load_model, save_model
from lmckit.forms._recipe import aligned_form
from lmckit.hf import zoo_from_hf
from lmckit.measure._measure import EvalSettings, measure_path
from lmckit.models import ZooModel
from lmckit.plan import AlignRequest, plan_alignment
from lmckit.symmetry._params import Params

SYMMETRIES = ("permutation", "orthogonal", None)
STARTS = ("anchored", "identity", "best")


def _as_zoo(a: LoadedModel, module: nn.Module, pa: Params, pb: Params) -> tuple:
    """A Hugging Face GPT-2 pair as lmckit's GPT-2 (written and read back), for its
    circuit form; a zoo pair as it is."""
    if isinstance(module, ZooModel):
        return module, pa, pb
    with tempfile.TemporaryDirectory() as tmp:
        save_model(Path(tmp) / "b", a, pb)
        zoo, zb = zoo_from_hf(Path(tmp) / "b")
    _, za = zoo_from_hf(a.path)
    return zoo, za, zb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--data", required=True, help="lmckit data spec (test split measured)")
    parser.add_argument("--forms", default="projected,circuits")
    parser.add_argument("--starts", default=",".join(STARTS))
    parser.add_argument("--symmetries", default="permutation,orthogonal,none")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    a, b = load_model(args.a), load_model(args.b)
    data = load_data(args.data)
    settings = EvalSettings()
    rows = []
    for sym_name in args.symmetries.split(","):
        symmetry = None if sym_name == "none" else sym_name
        for form in args.forms.split(","):
            for start in args.starts.split(","):
                begin = time.perf_counter()
                try:
                    request = AlignRequest(symmetry=symmetry, circuits=form == "circuits",
                                           config=WeightMatchingConfig(start=start),
                                           has_data=True)  # fmt: skip
                    aligned = plan_alignment(a, request).run(b, data)
                except ValueError as err:
                    print(f"{sym_name} {form} {start}: {err}", flush=True)
                    break
                seconds = time.perf_counter() - begin
                ref = aligned.reference if aligned.reference is not None else a.params
                row = {
                    "symmetry": sym_name,
                    "form": form,
                    "start": start,
                    "kept": aligned.metadata["start"].get("chosen", start),
                    "sweeps": aligned.result.iterations,
                    "stop": aligned.result.stop,
                    "align_seconds": round(seconds, 2),
                }
                paths = {"circuits": True}
                if form != "circuits":
                    paths = {"projected": False, "circuits": True}
                for path, circuits in paths.items():
                    module, pa, pb = aligned.module, ref, aligned.params
                    if circuits and form != "circuits":
                        module, pa, pb = _as_zoo(a, aligned.module, pa, pb)
                        f = aligned_form(module, pa, pb, circuits=True)
                        module, pa, pb = f.module, f.a, f.b
                    result = measure_path(module, pa, pb, data, settings)
                    row[f"barrier_{path}_path"] = round(result.barrier_loss, 4)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
