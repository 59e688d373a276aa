"""lmckit beside the paper's code on the same two GPT-2s (not run by CI).

Takes two Hugging Face GPT-2 folders (e.g. from ``scripts/train_hf_gpt2.py``), runs the
reference implementation of Generalized LMC for Transformers from a local checkout in its
own Python environment (``benchmarks/reference_side.py``, a subprocess) and lmckit in
this one, on the same models and the same test split, and prints one table: vanilla
averaging, weight matching with permutations only, orthogonal weight matching and (with
``--learned``) learned orthogonal matching; a test-loss barrier (11 points) and the wall
time of the alignment for each side.

One evaluator serves both sides (:func:`lmckit.measure._evaluate.evaluate_along`, lmckit's
circuit-form GPT-2 on the test blocks). The reference hands back its two aligned models
in its circuit layout; they are read into lmckit's (query/key circuits, output/value
circuits; per-head value biases summed into the output bias; key-side score terms, which
cancel in the softmax, dropped) with the RMSNorm biases kept apart. Every aligned pair is
then measured on two paths that agree at the ends:

* ``paper path``: circuits and RMSNorm biases interpolated separately, as the paper's
  merger does (the biases are folded into the readers at each point, exactly);
* ``lmckit path``: lmckit's form, where each RMSNorm bias is folded into its readers'
  biases before interpolating.

The reading of the reference's layout is checked on every run: its merged model's logits
at t = 0.5 must match the evaluator's (``check`` in the JSON). The reference's weight
matching is given the training split's token counts (it masks the tokens that never
occur); lmckit masks the same rows. The reference's merger starts its maps at a random
near-identity element; here they are exactly the weight-matching result.

    .venv/bin/python benchmarks/reference_comparison.py /work/runs/reference/char48/seed0 \
        /work/runs/reference/char48/seed1 \
        --reference /work/ext/Generalized-LMC-for-Transformers \
        --reference-python /work/ext/venv-ref/bin/python --json /tmp/cmp.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lmckit.aligners import LearnedMatchingConfig, WeightMatchingConfig, learned_matching
from lmckit.aligners import weight_matching as wm
from lmckit.data import Dataset, batches
from lmckit.data._token_stats import seen_token_masks, text_prefix, token_counts
from lmckit.forms._recipe import aligned_form
from lmckit.hf import zoo_from_hf
from lmckit.measure._evaluate import evaluate_along, linear_grid
from lmckit.models import ZooModel
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import Permutation, SymmetrySpec, Transform, apply

HERE = Path(__file__).resolve().parent
#: a residual vector added after each RMSNorm (the LayerNorm bias over its gain)
Betas = dict[str, Tensor]


@dataclass(frozen=True)
class Pair:
    """Two GPT-2s in lmckit's forms.

    Attributes:
        ln: the LayerNorm zoo module; ``ln_a``, ``ln_b`` its parameters (vanilla path).
        circuits: the RMSNorm circuit-form module; ``a``, ``b`` the models in it with
            the norm biases folded into the readers (what weight matching compares).
        bare_a, bare_b, betas_a, betas_b: the same without the norm biases, and the
            biases (``ln bias / ln gain``) by norm name (``transformer.h.0.ln_1``).
        spec: the circuit form's spec (orthogonal residual stream).
    """

    ln: ZooModel
    ln_a: Params
    ln_b: Params
    circuits: ZooModel
    a: Params
    b: Params
    bare_a: Params
    bare_b: Params
    betas_a: Betas
    betas_b: Betas
    spec: SymmetrySpec


def _norms(module: ZooModel, params: Params) -> list[str]:
    return sorted(k.removesuffix(".bias") for k in params if k.endswith(("ln_1.bias", "ln_2.bias")))


def load_pair(path_a: str | Path, path_b: str | Path) -> Pair:
    """Both Hugging Face folders as zoo GPT-2s, in circuit form with and without norm biases."""
    ln, ln_a = zoo_from_hf(path_a)
    _, ln_b = zoo_from_hf(path_b)
    names = [*_norms(ln, ln_a), "transformer.ln_f"]

    def split(params: Params) -> tuple[Params, Betas]:
        betas = {n: (params[f"{n}.bias"] / params[f"{n}.weight"]).float() for n in names}
        zero = dict(params) | {f"{n}.bias": torch.zeros_like(params[f"{n}.bias"]) for n in names}
        return zero, betas

    zero_a, betas_a = split(ln_a)
    zero_b, betas_b = split(ln_b)
    form = aligned_form(ln, ln_a, ln_b, symmetry="orthogonal", circuits=True)
    bare = aligned_form(ln, zero_a, zero_b, symmetry="orthogonal", circuits=True)
    assert isinstance(form.module, ZooModel)
    return Pair(
        ln, ln_a, ln_b, form.module, form.a, form.b, bare.a, bare.b, betas_a, betas_b, form.spec
    )


def fold(bare: Params, betas: Betas, layers: int) -> Params:
    """Circuit-form parameters with each RMSNorm bias folded into its readers (exact:
    key-side score terms are constant over the keys and cancel in the softmax)."""
    out = dict(bare)
    for i in range(layers):
        pre = f"transformer.h.{i}"
        b1, b2 = betas[f"{pre}.ln_1"], betas[f"{pre}.ln_2"]
        qk, ov = out[f"{pre}.attn.qk_weight"], out[f"{pre}.attn.ov_weight"]
        out[f"{pre}.attn.qk_bias"] = out[f"{pre}.attn.qk_bias"] + torch.einsum("hed,d->he", qk, b1)
        out[f"{pre}.attn.ov_bias"] = out[f"{pre}.attn.ov_bias"] + torch.einsum("hed,d->e", ov, b1)
        fc = f"{pre}.mlp.c_fc"
        out[f"{fc}.bias"] = out[f"{fc}.bias"] + out[f"{fc}.weight"] @ b2
    out["lm_head.bias"] = out["lm_head.bias"] + out["lm_head.weight"] @ betas["transformer.ln_f"]
    return out


def moved(pair: Pair, spec: SymmetrySpec, transform: Transform) -> tuple[Params, Betas]:
    """B's bare circuit parameters and norm biases with ``transform`` applied."""
    rotation = spec["residual"].group.matrix(transform["residual"]).float()
    betas = {n: rotation @ v for n, v in pair.betas_b.items()}
    return apply(spec, pair.bare_b, transform), betas


def from_reference(state: Mapping[str, Tensor], heads: int) -> tuple[Params, Betas]:
    """The reference's circuit layout (HF ``Conv1D``, heads of width ``d + 1`` acting on
    ``[x; 1]``) as lmckit's bare circuit parameters and the RMSNorm biases."""
    d = state["transformer.wte.weight"].shape[1]
    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("transformer.h."))
    out: Params = {
        k: state[k].float() for k in ("transformer.wte.weight", "transformer.wpe.weight")
    }
    out["lm_head.weight"] = state["lm_head.weight"].float()
    out["lm_head.bias"] = torch.zeros(out["lm_head.weight"].shape[0])
    betas = {"transformer.ln_f": state["transformer.ln_f.bias"].float()}
    for i in range(layers):
        pre = f"transformer.h.{i}"
        for k in ("ln_1", "ln_2"):
            betas[f"{pre}.{k}"] = state[f"{pre}.{k}.bias"].float()
        # rows of [W | b] per head: (heads, d + 1 outputs, d + 1 inputs); the queries'
        # block is QK^T scaled so that HF's 1/sqrt(d + 1) gives the head's 1/sqrt(head_dim)
        aug = torch.cat(
            [state[f"{pre}.attn.c_attn.weight"].T, state[f"{pre}.attn.c_attn.bias"][:, None]], 1
        )
        q = aug[: heads * (d + 1)].reshape(heads, d + 1, d + 1).float() / (d + 1) ** 0.5
        out[f"{pre}.attn.qk_weight"] = q[:, :d, :d].contiguous()
        out[f"{pre}.attn.qk_bias"] = q[:, :d, d].contiguous()
        o = state[f"{pre}.attn.c_proj.weight"].float().reshape(heads, d + 1, d)  # (h, in, out)
        out[f"{pre}.attn.ov_weight"] = o[:, :d, :].transpose(1, 2).contiguous()
        out[f"{pre}.attn.ov_bias"] = state[f"{pre}.attn.c_proj.bias"].float() + o[:, d, :].sum(0)
        for k in ("c_fc", "c_proj"):
            out[f"{pre}.mlp.{k}.weight"] = state[f"{pre}.mlp.{k}.weight"].float().T.contiguous()
            out[f"{pre}.mlp.{k}.bias"] = state[f"{pre}.mlp.{k}.bias"].float()
    return out, betas


def barrier_paths(
    pair: Pair, data: Dataset, bare_b: Params, betas_b: Betas, *, batch: int = 32
) -> dict[str, float]:
    """Test-loss barriers of A to an aligned B on the paper's path and on lmckit's."""
    layers = pair.circuits.n_layer
    x, y = data.split("test")

    def loader():
        return batches(x, y, batch)

    def mix(p: Mapping[str, Tensor], q: Mapping[str, Tensor], t: float) -> dict[str, Tensor]:
        return {k: (1 - t) * p[k] + t * q[k] for k in p}

    ts = linear_grid(11)
    paper = evaluate_along(
        pair.circuits,
        lambda t: fold(mix(pair.bare_a, bare_b, t), mix(pair.betas_a, betas_b, t), layers),
        loader,
        ts=ts,
    )
    folded_b = fold(bare_b, betas_b, layers)
    ours = evaluate_along(pair.circuits, lambda t: mix(pair.a, folded_b, t), loader, ts=ts)
    return {"paper_path": paper.barrier_loss, "lmckit_path": ours.barrier_loss}


def vanilla_barrier(pair: Pair, data: Dataset, *, batch: int = 32) -> float:
    x, y = data.split("test")
    path = evaluate_along(
        pair.ln,
        lambda t: {k: (1 - t) * pair.ln_a[k] + t * pair.ln_b[k] for k in pair.ln_a},
        lambda: batches(x, y, batch),
        ts=linear_grid(11),
    )
    return path.barrier_loss


def lmckit_align(
    pair: Pair,
    data: Dataset,
    *,
    permutations_only: bool = False,
    config: WeightMatchingConfig | None = None,
    row_weights: Mapping[str, Tensor] | None = None,
    masks: bool = True,
) -> tuple[SymmetrySpec, Transform, float]:
    """lmckit's data-free weight matching of the pair (circuit form; seen-token rows)."""
    spec = pair.spec.with_groups(residual=Permutation()) if permutations_only else pair.spec
    begin = time.perf_counter()
    result = wm(
        spec,
        pair.a,
        pair.b,
        config,
        row_masks=seen_token_masks(data) if masks else None,
        row_weights=row_weights,
    )
    return spec, result.transform, time.perf_counter() - begin


def reference_run(
    args: argparse.Namespace, data: Dataset, work: Path, *, permutations_only: bool, learn: bool
) -> tuple[dict, dict[str, Tensor], dict[str, Tensor]]:
    """Run ``reference_side.py`` in the reference's environment; its meta, weights, check."""
    from safetensors.torch import load_file

    read, predicted = token_counts(data)
    torch.save(read + predicted, work / "freqs.pt")
    torch.save(data.x_test[:2].clone(), work / "check.pt")
    torch.save(data.x_train.clone(), work / "train.pt")
    out = work / ("perm" if permutations_only else "orth") / ("learned" if learn else "wm")
    cmd = [
        str(args.reference_python),
        str(HERE / "reference_side.py"),
        "--reference", str(args.reference),
        "--a", str(args.a),
        "--b", str(args.b),
        "--freqs", str(work / "freqs.pt"),
        "--check", str(work / "check.pt"),
        "--out", str(out),
        "--threads", str(args.threads),
    ]  # fmt: skip
    if permutations_only:
        cmd.append("--permutations-only")
    if learn:
        cmd += ["--learn", str(work / "train.pt"), "--max-seconds", str(args.learn_seconds)]
    subprocess.run(cmd, check=True, cwd=args.reference, stdout=subprocess.DEVNULL)
    meta = json.loads((out / "meta.json").read_text())
    state = load_file(str(out / "weights.safetensors"))
    return meta, state, load_file(str(out / "check.safetensors"))


def _reference_row(
    pair: Pair, data: Dataset, meta: dict, state: dict[str, Tensor], check: dict[str, Tensor]
) -> dict:
    heads = int(meta["n_head"])
    bare_a, betas_a = from_reference(
        {k[2:]: v for k, v in state.items() if k.startswith("a.")}, heads
    )
    bare_b, betas_b = from_reference(
        {k[2:]: v for k, v in state.items() if k.startswith("b.")}, heads
    )
    layers = pair.circuits.n_layer
    mid = {k: 0.5 * (bare_a[k] + bare_b[k]) for k in bare_a}
    mid_betas = {k: 0.5 * (betas_a[k] + betas_b[k]) for k in betas_a}
    x = data.x_test[:2]
    with torch.no_grad():
        ours = torch.func.functional_call(pair.circuits.eval(), fold(mid, mid_betas, layers), (x,))
        a_ref = torch.func.functional_call(pair.circuits, fold(bare_a, betas_a, layers), (x,))
        a_ours = torch.func.functional_call(pair.circuits, pair.a, (x,))
    row = barrier_paths(pair, data, bare_b, betas_b)
    row["check"] = float((ours - check["logits"]).abs().max())
    row["check_a"] = float((a_ref - a_ours).abs().max())
    timing = meta["timings"]
    row["seconds"] = timing["weight_matching"]
    if meta.get("learned"):
        row["seconds"] = timing["weight_matching"] + meta["learned"]["seconds"]
        row["steps"] = meta["learned"]["steps"]
    return row


def load_data(args: argparse.Namespace) -> Dataset:
    recipe = json.loads((Path(args.a) / "lmckit_data.json").read_text())
    return text_prefix(
        recipe["text"], recipe["tokenizer"], block=recipe["block"], tokens=recipe["tokens"]
    )


def compare(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
    """Every row of the table (module docstring) as a dict."""
    data = load_data(args)
    pair = load_pair(args.a, args.b)
    rows: dict[str, dict] = {"vanilla": {"lmckit": {"paper_path": vanilla_barrier(pair, data)}}}
    log(f"vanilla {rows['vanilla']['lmckit']['paper_path']:.4f}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        for name, perm in (("WM permutations only", True), ("WM orthogonal", False)):
            spec, transform, seconds = lmckit_align(pair, data, permutations_only=perm)
            ours = barrier_paths(pair, data, *moved(pair, spec, transform)) | {"seconds": seconds}
            ref = _reference_row(
                pair, data, *reference_run(args, data, work, permutations_only=perm, learn=False)
            )
            rows[name] = {"lmckit": ours, "reference": ref}
            log(f"{name}: {json.dumps(rows[name])}")
        if args.learned:
            config = LearnedMatchingConfig(
                steps=args.learn_steps, batch_size=32, lr=0.01, max_seconds=args.learn_seconds
            )
            begin = time.perf_counter()
            result = learned_matching(
                pair.spec, pair.a, pair.b, config, model=pair.circuits, data=data,
                row_masks=seen_token_masks(data),
            )  # fmt: skip
            seconds = time.perf_counter() - begin
            ours = barrier_paths(pair, data, *moved(pair, pair.spec, result.transform))
            ref = _reference_row(
                pair, data, *reference_run(args, data, work, permutations_only=False, learn=True)
            )
            rows["learned orthogonal"] = {"lmckit": ours | {"seconds": seconds}, "reference": ref}
            log(f"learned orthogonal: {json.dumps(rows['learned orthogonal'])}")
    return rows


def format_rows(rows: dict) -> str:
    head = (
        f"{'method':<22} {'reference':>10} {'lmckit':>10} {'lmckit*':>10} "
        f"{'ref s':>8} {'lmckit s':>9}"
    )
    lines = [head, "-" * len(head)]
    for name, row in rows.items():
        ref, ours = row.get("reference", {}), row["lmckit"]

        def num(d: dict, key: str, fmt: str = "{:.4f}") -> str:
            return fmt.format(d[key]) if key in d else "-"

        lines.append(
            f"{name:<22} {num(ref, 'paper_path'):>10} {num(ours, 'paper_path'):>10} "
            f"{num(ours, 'lmckit_path'):>10} {num(ref, 'seconds', '{:.1f}'):>8} "
            f"{num(ours, 'seconds', '{:.1f}'):>9}"
        )
    lines.append("barriers: test loss, 11 points, the paper's path (norm biases interpolated);")
    lines.append("lmckit*: lmckit's path (norm biases folded into readers); s: alignment wall time")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="Hugging Face GPT-2 folder (with lmckit_data.json)")
    parser.add_argument("b", type=Path)
    parser.add_argument("--reference", type=Path, required=True, help="the paper's code checkout")
    parser.add_argument("--reference-python", type=Path, required=True, help="its environment")
    parser.add_argument("--learned", action="store_true", help="also learned orthogonal matching")
    parser.add_argument("--learn-steps", type=int, default=300)
    parser.add_argument("--learn-seconds", type=float, default=300.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the reference's outputs in this folder"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.a, args.b = args.a.resolve(), args.b.resolve()
    rows = compare(args, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(format_rows(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
