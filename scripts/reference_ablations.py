"""Ablations of lmckit's weight matching toward the paper's code, one difference per row.

On a GPT-2 pair (Hugging Face folders with ``lmckit_data.json``, as for
``benchmarks/reference_comparison.py``), in circuit form, lmckit's default (anchored
start, rows of tokens never seen masked out) is changed in one respect at a time toward
what the reference implementation does (docs/experiments/reference_comparison.md lists the
differences):

* ``start``: coordinate descent from the identity (lmckit's old default) instead of the
  anchored start;
* ``mask vs weights``: token rows weighted by training frequency on top of the mask;
* ``block scaling``: the token-embedding, position-embedding and LM-head blocks each
  scaled to unit total weight per row count (rows weighted by ``1 / rows``), as the
  reference divides each block by the square root of its number of columns;
* ``head cost``: heads assigned on the sum of the Frobenius *distances* of their QK and
  OV circuits (not squared), the reference's cost, instead of lmckit's inner products;
* ``FFN cost``: MLP units assigned on the L1 distance of their L2-normalised
  ``[input weights, bias, output weights]``, the reference's cost;
* ``best of two starts``: both starts run, the higher objective kept; or (``start="best"``)
  the one whose midpoint has the lower loss on 256 training examples.

The two cost rows run their own alternation (residual by lmckit's solver, then heads,
then units, until nothing changes, at most 30 rounds) from the anchored start. Barriers:
test loss, 11 points, on the paper's path and on lmckit's (see the benchmark).

    nice .venv/bin/python scripts/reference_ablations.py /work/runs/reference/char48/seed0 \
        /work/runs/reference/char48/seed1 [--permutations-only]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from reference_comparison import (  # noqa: E402
    Pair,
    barrier_paths,
    fold,
    from_reference,
    load_data,
    load_pair,
    moved,
)

from lmckit.aligners import WeightMatchingConfig, weight_matching  # noqa: E402
from lmckit.aligners._weight.anchored import anchored_start  # noqa: E402
from lmckit.data import Dataset  # noqa: E402
from lmckit.data._token_stats import seen_token_masks, token_row_weights  # noqa: E402
from lmckit.symmetry._transform import Permutation, SymmetrySpec, Transform, apply  # noqa: E402

ROWS = ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight")


def _objective(spec: SymmetrySpec, a: dict, b: dict, masks: dict) -> float:
    names = {u.param for s in spec for u in s.uses if u.compare}
    total = 0.0
    for n in names:
        x, y = a[n].double(), b[n].double()
        if n in masks:
            x, y = x[masks[n]], y[masks[n]]
        total += float((x * y).sum())
    return total


def _heads_cost(a: dict, b: dict, layer: int) -> torch.Tensor:
    """Reference head cost: ||QK_a,i - QK_b,j||_F + ||OV_a,i - OV_b,j||_F."""
    pre = f"transformer.h.{layer}.attn"

    def qk(p):  # (h, d, d + 1): the query-side circuit with its bias
        return torch.cat([p[f"{pre}.qk_weight"], p[f"{pre}.qk_bias"][:, :, None]], 2).flatten(1)

    def ov(p):
        return p[f"{pre}.ov_weight"].flatten(1)

    return torch.cdist(qk(a), qk(b)) + torch.cdist(ov(a), ov(b))


def _ffn_cost(a: dict, b: dict, layer: int) -> torch.Tensor:
    """Reference unit cost: L1 distance of L2-normalised [c_fc row, bias, c_proj column]."""
    pre = f"transformer.h.{layer}.mlp"

    def units(p):
        rows = torch.cat(
            [p[f"{pre}.c_fc.weight"], p[f"{pre}.c_fc.bias"][:, None], p[f"{pre}.c_proj.weight"].T],
            1,
        )
        return rows / rows.norm(dim=1, keepdim=True)

    return torch.cdist(units(a), units(b), p=1)


def alternate(
    pair: Pair,
    spec: SymmetrySpec,
    masks: dict,
    *,
    head_cost: bool,
    ffn_cost: bool,
    rounds: int = 30,
) -> Transform:
    """Residual by lmckit, heads and units by the reference's costs where asked."""
    layers = pair.circuits.n_layer
    # the anchored start, on the rows the matching compares
    a = {k: v[masks[k]] if k in masks else v for k, v in pair.a.items()}
    b = {k: v[masks[k]] if k in masks else v for k, v in pair.b.items()}
    transform = anchored_start(spec, a, b, Transform.identity(spec))
    residual_only = {"residual"}
    for _ in range(rounds):
        before = transform
        transform = weight_matching(
            spec, pair.a, pair.b, WeightMatchingConfig(max_iter=1), init=transform,
            spaces=["residual"], row_masks=masks,
        ).transform  # fmt: skip
        rest = {s.name: s.group.identity(s.n) for s in spec if s.name not in residual_only}
        b_res = apply(spec, pair.b, transform.replace(**rest))
        elements = {}
        for i in range(layers):
            for name, custom, cost in (
                (f"heads.{i}", head_cost, _heads_cost),
                (f"ffn.{i}", ffn_cost, _ffn_cost),
            ):
                if custom:
                    _, cols = linear_sum_assignment(cost(pair.a, b_res, i).numpy())
                    elements[name] = torch.as_tensor(cols)
        transform = transform.replace(**elements)
        lmckit_solved = [n for n in spec.names if n not in residual_only and n not in elements]
        if lmckit_solved:
            transform = weight_matching(
                spec, pair.a, pair.b, WeightMatchingConfig(max_iter=1), init=transform,
                spaces=lmckit_solved, row_masks=masks,
            ).transform  # fmt: skip
        if all(spec[n].group.close(before[n], transform[n]) for n in spec.names):
            break
    return transform


def reference_transform(pair: Pair, spec: SymmetrySpec, weights: Path, masks: dict) -> Transform:
    """The transform the reference applied to B, as an element of lmckit's spec.

    The reference's aligned B is an exact symmetry image of B, so weight matching
    recovers the transform that maps B onto it (checked).
    """
    from safetensors.torch import load_file

    state = load_file(str(weights))
    heads = pair.circuits.n_head
    bare, betas = from_reference({k[2:]: v for k, v in state.items() if k.startswith("b.")}, heads)
    target = fold(bare, betas, pair.circuits.n_layer)
    found = weight_matching(spec, target, pair.b, WeightMatchingConfig(start="identity"))
    back = apply(spec, pair.b, found.transform)
    worst = max(float((back[k] - target[k]).abs().max() / target[k].abs().max()) for k in target)
    if worst > 1e-3:
        raise SystemExit(f"the reference's B is not recovered as a symmetry image ({worst:.2g})")
    return found.transform


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--permutations-only", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument(
        "--reference-weights",
        type=Path,
        default=None,
        help="weights.safetensors the reference wrote (reference_comparison.py --keep): "
        "adds its transform and lmckit's descent from it",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.a, args.b = args.a.resolve(), args.b.resolve()
    data: Dataset = load_data(args)
    pair = load_pair(args.a, args.b)
    spec = pair.spec.with_groups(residual=Permutation()) if args.permutations_only else pair.spec
    masks = seen_token_masks(data)
    weights = token_row_weights(data)
    counts = {
        k: float(masks.get(k, torch.ones(pair.a[k].shape[0], dtype=torch.bool)).sum()) for k in ROWS
    }
    block = {k: torch.full((pair.a[k].shape[0],), 1.0 / counts[k]) for k in ROWS}

    def wm(**options):
        config = WeightMatchingConfig(start=options.pop("start", "anchored"))
        return weight_matching(
            spec,
            pair.a,
            pair.b,
            config,
            model=pair.circuits,
            data=data,
            row_masks=masks,
            **options,
        ).transform

    def best_of_two():
        found = [wm(start=s) for s in ("identity", "anchored")]
        scores = [_objective(spec, pair.a, apply(spec, pair.b, t), masks) for t in found]
        return found[max(range(2), key=scores.__getitem__)]

    rows = {
        "lmckit default (anchored start, mask)": lambda: wm(),
        "start: identity": lambda: wm(start="identity"),
        "mask vs weights: + token-frequency weights": lambda: wm(row_weights=weights),
        "block scaling (embedding, position, LM-head blocks)": lambda: wm(row_weights=block),
        "head cost: circuit distances": lambda: alternate(
            pair, spec, masks, head_cost=True, ffn_cost=False
        ),
        "FFN cost: L1 of normalised units": lambda: alternate(
            pair, spec, masks, head_cost=False, ffn_cost=True
        ),
        "both reference costs": lambda: alternate(pair, spec, masks, head_cost=True, ffn_cost=True),
        "best of two starts (by objective)": best_of_two,
        "best of two starts (by midpoint training loss)": lambda: wm(start="best"),
    }
    if args.reference_weights is not None:
        found = reference_transform(pair, spec, args.reference_weights, masks)
        rows["the reference's transform"] = lambda: found
        rows["lmckit descent from the reference's transform"] = lambda: wm(init=found)
    mode = "permutations only" if args.permutations_only else "orthogonal"
    for name, run in rows.items():
        if args.only and not any(name.startswith(o) for o in args.only):
            continue
        begin = time.perf_counter()
        transform = run()
        seconds = time.perf_counter() - begin
        objective = _objective(spec, pair.a, apply(spec, pair.b, transform), masks)
        barriers = barrier_paths(pair, data, *moved(pair, spec, transform))
        print(
            f"{mode} | {name}: paper path {barriers['paper_path']:.4f}, lmckit path "
            f"{barriers['lmckit_path']:.4f}, objective {objective:.6g}, {seconds:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
