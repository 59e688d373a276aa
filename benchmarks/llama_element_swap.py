"""Why weight matching stops short on the trained Llama pair: its element against learned
matching's, component by component.

On the pair ``lmckit reproduce llama-shakespeare`` trains, orthogonal weight matching and
learned matching search the same group (residual stream, key/value groups, query heads
within groups, value bases, rotary planes, MLP units and their up-branch scales) and end
far apart: a loss barrier of about 0.54 against 0.15. This script asks where the
difference lies and whether weight matching's objective points towards learned
matching's element at all. With both elements ``W`` (weight matching) and ``L`` (learned
matching) it prints the test-split loss barrier (11 points) of:

1. ``W`` and ``L``;
2. per kind of space: ``W`` with that kind taken from ``L``, and ``L`` with that kind
   taken from ``W``;
3. per kind of space: ``L`` with that kind solved again by weight matching, the other
   spaces held at ``L``;
4. weight matching started from ``L`` (every space);

and, for ``W`` and ``L``, the weight-matching objective (the sum over parameters of
``<A_p, T(B)_p>``) and the cosine of every kind of parameter, averaged over layers.

Run: ``python benchmarks/llama_element_swap.py --run runs/llama-shakespeare/full-<hash>``
(about 7 minutes on 2 cores; learned matching with the experiment's settings takes most).
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor
from trained_llama import TrainedPair, load_pair

from lmckit.aligners import (
    LearnedMatchingConfig,
    WeightMatchingConfig,
    learned_matching,
    weight_matching,
)
from lmckit.data import batches
from lmckit.measure._evaluate import evaluate_path
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform, apply

Elements = dict[str, Tensor]


#: labels of the nested spaces' kinds (:class:`lmckit.symmetry.Nest`)
NESTED = {"query": "query heads", "value": "value bases", "qk": "rotary planes",
          "scale": "up-branch scales"}  # fmt: skip


def space_kind(spec: SymmetrySpec, space: Space) -> str:
    """The kind of a space of the Llama spec: a nested space by its nest's kind, a
    space others nest in by theirs (value bases live in key/value groups, scales in MLP
    units); the space nothing nests in is the residual."""
    if space.nest is not None:
        return NESTED.get(space.nest.kind, space.nest.kind)
    inner = {s.nest.kind for s in spec.nested_in(space.name) if s.nest is not None}
    if not inner:
        return "residual"
    return "key/value groups" if "value" in inner else "MLP units"


def param_kind(name: str) -> str:
    """A parameter's name without its layer number (``mlp.up_proj.weight``)."""
    return re.sub(r"^model\.layers\.\d+\.", "", name)


def barrier(pair: TrainedPair, elements: Mapping[str, Tensor]) -> float:
    form = pair.form
    b = apply(form.spec, form.b, Transform(form.spec, dict(elements)))
    data = pair.data
    result = evaluate_path(pair.module, form.a, b,
                           lambda: batches(data.x_test, data.y_test, pair.config.eval_batch),
                           points=11)  # fmt: skip
    return result.barrier_loss


def inner_products(
    pair: TrainedPair, elements: Mapping[str, Tensor]
) -> dict[str, tuple[float, float]]:
    """``<A_p, T(B)_p>`` and the cosine of ``A_p`` and ``T(B)_p``, of every parameter some
    space moves."""
    form = pair.form
    moved = {u.param for s in form.spec for u in s.uses}
    b = apply(form.spec, form.b, Transform(form.spec, dict(elements)))
    out = {}
    for name in sorted(moved):
        x, y = form.a[name].float(), b[name].float()
        inner = float((x * y).sum())
        out[name] = inner, inner / float(x.norm() * y.norm())
    return out


def agreement(inner: Mapping[str, tuple[float, float]]) -> tuple[float, dict[str, float]]:
    """The weight-matching objective ``sum_p <A_p, T(B)_p>`` and each kind of parameter's
    cosine, averaged over layers."""
    cosines: dict[str, list[float]] = {}
    for name, (_, cosine) in inner.items():
        cosines.setdefault(param_kind(name), []).append(cosine)
    return sum(v for v, _ in inner.values()), {k: sum(c) / len(c) for k, c in cosines.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--run", type=Path, required=True, help="runs/llama-shakespeare/full-<hash>"
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.run)
    spec, config = pair.form.spec, pair.config

    start = time.perf_counter()
    wm = weight_matching(spec, pair.form.a, pair.form.b, WeightMatchingConfig(), seed=0)
    learned_config = LearnedMatchingConfig(
        steps=config.learned_steps, batch_size=config.batch_size, lr=config.learned_lr
    )
    learned = learned_matching(spec, pair.form.a, pair.form.b, learned_config,
                               model=pair.module, data=pair.data)  # fmt: skip
    w: Elements = {n: wm.transform[n] for n in spec.names}
    lm: Elements = {n: learned.transform[n] for n in spec.names}
    print(f"aligned in {time.perf_counter() - start:.0f} s")
    print(f"\nbarrier: weight matching W {barrier(pair, w):.3f}, learned L {barrier(pair, lm):.3f}")

    kinds: dict[str, list[str]] = {}
    for space in spec:
        kinds.setdefault(space_kind(spec, space), []).append(space.name)
    print(
        "\n| kind of space | W, this kind from L | L, this kind from W "
        "| L, this kind solved again by WM |"
    )
    print("|---|---:|---:|---:|")
    for kind, names in kinds.items():
        w_with_l = {n: lm[n] if n in names else w[n] for n in w}
        l_with_w = {n: w[n] if n in names else lm[n] for n in w}
        again = weight_matching(spec, pair.form.a, pair.form.b, WeightMatchingConfig(), seed=0,
                                init=Transform(spec, lm), spaces=names)  # fmt: skip
        resolved = {n: again.transform[n] for n in spec.names}
        print(
            f"| {kind} | {barrier(pair, w_with_l):.3f} | {barrier(pair, l_with_w):.3f} "
            f"| {barrier(pair, resolved):.3f} |"
        )

    from_l = weight_matching(spec, pair.form.a, pair.form.b, WeightMatchingConfig(), seed=0,
                             init=Transform(spec, lm))  # fmt: skip
    from_l_elements = {n: from_l.transform[n] for n in spec.names}
    print(f"\nweight matching started from L: barrier {barrier(pair, from_l_elements):.3f}")

    rows = [("W", w), ("L", lm), ("WM from L", from_l_elements)]
    inner = {label: inner_products(pair, el) for label, el in rows}
    higher = [p for p in inner["W"] if inner["L"][p][0] > inner["W"][p][0]]
    print(f"\nparameters on which L agrees with A more than W does: {len(higher)} of "
          f"{len(inner['W'])} {higher or ''}")  # fmt: skip
    measured = [(label, *agreement(inner[label])) for label, _ in rows]
    print("\n| parameter (mean over layers) | " + " | ".join(r[0] for r in measured) + " |")
    print("|---|" + "---:|" * len(measured))
    print("| objective, sum of <A_p, T(B)_p> | "
          + " | ".join(f"{r[1]:.1f}" for r in measured) + " |")  # fmt: skip
    for kind in measured[0][2]:
        print(f"| {kind} (cosine) | " + " | ".join(f"{r[2][kind]:+.3f}" for r in measured) + " |")


if __name__ == "__main__":
    main()
