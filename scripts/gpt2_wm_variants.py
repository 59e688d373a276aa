"""Ablations of orthogonal weight matching on a trained GPT-2 pair (a study, not the API).

Loads two checkpoints written by ``lmckit reproduce gpt2-shakespeare`` and measures the
test loss barrier (11 points) after orthogonal weight matching in four variants:
the default (heads seen by the residual through QK/OV circuits), raw head weights,
the residual matched on the embeddings and LM head alone, and embedding/LM-head rows
weighted by the square root of each token's training frequency.

    python scripts/gpt2_wm_variants.py runs/gpt2 --data-root ../shared/data --seed 1

(``--quick`` for the models of ``reproduce gpt2-shakespeare --quick``.)
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from lmckit import checkpoint
from lmckit.align import WeightMatchingConfig, weight_matching
from lmckit.data import batches
from lmckit.evaluate import evaluate_path, linear_grid
from lmckit.experiments.gpt2_shakespeare import paper_config, quick_config, shakespeare_tokens
from lmckit.rewrites import layernorm_to_rmsnorm
from lmckit.symmetry import SymmetrySpec, apply

EMBEDDINGS = ("transformer.wte", "transformer.wpe", "lm_head")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the --out folder of gpt2-shakespeare")
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--seed", type=int, default=0, help="the pair is seeds s and s + 1")
    parser.add_argument("--quick", action="store_true", help="the --quick run's models")
    args = parser.parse_args()
    config = quick_config() if args.quick else paper_config()
    mode = "quick" if args.quick else "paper"
    root = args.out / f"{mode}-{config.fingerprint()}"
    if not root.is_dir():
        parser.error(f"{root} does not exist: run `lmckit reproduce gpt2-shakespeare` first")
    data = shakespeare_tokens(
        args.data_root / "tinyshakespeare" / "input.txt",
        args.data_root / "gpt2_tokenizer",
        block=config.context,
        tokens=config.tokens,
    )
    la, lb = (
        checkpoint.load(root / "models" / f"gpt2-{config.n_embd}-seed{s}")
        for s in (args.seed, args.seed + 1)
    )
    rms, a = layernorm_to_rmsnorm(la.model, la.params)
    _, b = layernorm_to_rmsnorm(la.model, lb.params)
    seen = torch.zeros(data.num_classes, dtype=torch.bool)
    seen[data.x_train.unique()] = True
    seen[data.y_train.unique()] = True
    masks = {k: seen for k in ("transformer.wte.weight", "lm_head.weight")}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = (t.to(device) for t in data.split("test"))
    work = rms.to(device)
    a_dev = {k: v.to(device) for k, v in a.items()}

    def barrier(moved: dict) -> float:
        pb = {k: v.to(device) for k, v in moved.items()}
        return evaluate_path(
            work, a_dev, pb, lambda: batches(x, y, 16), ts=linear_grid(11)
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
    print(f"seeds {args.seed},{args.seed + 1}: vanilla (RMS form) {barrier(b):.4f}")
    for name, (s, pa, pb, cfg) in variants.items():
        start = time.perf_counter()
        res = weight_matching(s, pa, pb, cfg, row_masks=masks)
        print(
            f"seeds {args.seed},{args.seed + 1}: WM orthogonal, {name}: "
            f"barrier {barrier(apply(s, b, res.transform)):.4f}, {res.iterations} sweeps, "
            f"{time.perf_counter() - start:.1f} s"
        )


if __name__ == "__main__":
    main()
