"""Weight matching at real sizes: a GPT-2 of 124M-parameter shape and a ViT-B/16.

For each model: two zoo models with random weights (seeds 0 and 1) at the real shape,
put in their alignment form by ``lmckit.forms.aligned_form(module, a, b,
symmetry=...)`` (``orthogonal``: LayerNorm -> RMSNorm rewrite, an orthogonal residual
stream, heads compared by their QK/OV circuits, FFN units permuted) and written as
safetensors files to a temporary folder. A fresh process then reads both files, aligns
them by weight matching (to convergence, at most ``--max-iter`` sweeps), applies the
transform to the second model, and reports the time, the sweeps and its peak resident
memory from just before the weights are read (Linux ``VmHWM``, reset through
``/proc/self/clear_refs``) against the two models' bytes. The spec is inferred in that
process before the measurement starts.

Run: ``python benchmarks/bench_weight_matching_scale.py [--model gpt2 vit]
[--symmetry orthogonal] [--threads 2] [--max-iter 100] [--layers 12]``.
Targets: orthogonal WM on the GPT-2 under 30 s on 2 CPU cores; peak memory
at most 2.5x the two models' bytes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.forms._recipe import aligned_form
from lmckit.models import create_model
from lmckit.symmetry._transform import apply

SHAPES = {
    "gpt2": {
        "vocab_size": 50257,
        "n_layer": 12,
        "n_head": 12,
        "n_embd": 768,
        "n_inner": 3072,
        "context": 1024,
    },
    "vit": {
        "image_size": 224,
        "patch_size": 16,
        "in_channels": 3,
        "num_classes": 1000,
        "width": 768,
        "depth": 12,
        "heads": 12,
        "mlp_dim": 3072,
    },
}
DEPTH = {"gpt2": "n_layer", "vit": "depth"}


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def prepare(name: str, layers: int, symmetry: str, folder: Path) -> None:
    kwargs = {**SHAPES[name], DEPTH[name]: layers}
    module, a = create_model(name, seed=0, **kwargs)
    _, b = create_model(name, seed=1, **kwargs)
    form = aligned_form(module, a, b, symmetry=symmetry)
    save_file({k: v.contiguous() for k, v in form.a.items()}, folder / "a.safetensors")
    save_file({k: v.contiguous() for k, v in form.b.items()}, folder / "b.safetensors")
    config = form.module.config.to_json()  # type: ignore[union-attr]
    (folder / "config.json").write_text(json.dumps({**config, "form": form.form}))


def measure(folder: Path, max_iter: int) -> None:
    """Child process: spec, then (measured) read, align, apply."""
    config = json.loads((folder / "config.json").read_text())
    module, _ = create_model(config["architecture"], seed=0, **config["kwargs"])
    spec = module.symmetry_spec()
    del module, _
    gc.collect()
    baseline = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    start = time.perf_counter()
    a = load_file(folder / "a.safetensors")
    b = load_file(folder / "b.safetensors")
    loaded = time.perf_counter() - start
    model_bytes = sum(v.numel() * v.element_size() for p in (a, b) for v in p.values())
    start = time.perf_counter()
    result = weight_matching(spec, a, b, WeightMatchingConfig(max_iter=max_iter))
    matched = time.perf_counter() - start
    aligned = apply(spec, b, result.transform)
    total = time.perf_counter() - start
    peak = _status("VmHWM")
    before = sum(float((a[k].double() * b[k].double()).sum()) for k in a)
    objective = sum(float((a[k].double() * aligned[k].double()).sum()) for k in a)
    print(
        json.dumps(
            {
                "form": config["form"],
                "groups": sorted({type(s.group).__name__ for s in spec}),
                "spaces": len(spec),
                "params_per_model": sum(v.numel() for v in a.values()),
                "read_s": loaded,
                "wm_s": matched,
                "wm_and_apply_s": total,
                "sweeps": result.iterations,
                "converged": result.converged,
                "s_per_sweep": matched / result.iterations,
                "objective_before": before,
                "objective_after": objective,
                "two_models_bytes": model_bytes,
                "baseline_rss": baseline,
                "peak_rss": peak,
                "peak_over_baseline_ratio": (peak - baseline) / model_bytes,
                "load": os.getloadavg()[0],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", choices=sorted(SHAPES), default=["gpt2", "vit"])
    parser.add_argument("--symmetry", choices=("orthogonal", "permutation"), default="orthogonal")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.measure is not None:
        measure(args.measure, args.max_iter)
        return
    for name in args.model:
        with tempfile.TemporaryDirectory(prefix="lmckit-bench-") as tmp:
            start = time.perf_counter()
            prepare(name, args.layers, args.symmetry, Path(tmp))
            prepared = time.perf_counter() - start
            load = os.getloadavg()[0]
            child = [sys.executable, __file__, "--measure", tmp, "--threads", str(args.threads)]
            child += ["--max-iter", str(args.max_iter)]
            out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
        gib = 2**30
        print(f"{name} ({args.layers} layers), {args.symmetry}: {row['form']}, {row['groups']}")
        print(
            f"  {row['params_per_model'] / 1e6:.1f}M parameters per model; "
            f"prepared in {prepared:.0f} s"
        )
        print(
            f"  weight matching {row['wm_s']:.1f} s, {row['sweeps']} sweeps "
            f"(converged: {row['converged']}), {row['s_per_sweep']:.2f} s/sweep; "
            f"+ apply {row['wm_and_apply_s'] - row['wm_s']:.1f} s; read {row['read_s']:.1f} s"
        )
        print(f"  objective {row['objective_before']:.1f} -> {row['objective_after']:.1f}")
        print(
            f"  peak RSS {row['peak_rss'] / gib:.2f} GiB (baseline {row['baseline_rss'] / gib:.2f} "
            f"GiB); above baseline {row['peak_over_baseline_ratio']:.2f}x the two models' "
            f"{row['two_models_bytes'] / gib:.2f} GiB"
        )
        print(f"  load average {load:.1f} before, {row['load']:.1f} after", flush=True)


if __name__ == "__main__":
    main()
