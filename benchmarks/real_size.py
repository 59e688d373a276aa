"""Real checkpoints at real size: a bfloat16 sharded Llama pair through lmckit's commands.

Builds two random ``LlamaForCausalLM`` folders of TinyLlama's width (hidden 2048, MLP
5632, 32 query heads on 4 key/value heads, vocabulary 32,000; ``--size 307m``: 4 layers,
``1.1b``: TinyLlama's 22), stored in bfloat16 in shards of ``--shard`` with a
``tokenizer.json`` (a BPE tokenizer trained here on the Shakespeare text). Then times,
each in a fresh process, what a user runs:

- ``lmckit align A B --method weight --symmetry permutation --out X``, and the same with
  ``--symmetry orthogonal``;
- ``lmckit merge A X --out M``;
- ``lmckit barrier A X --data shakespeare:...`` (11 points, test split).

Each is reported with its wall time, the peak resident memory of its process
(``ru_maxrss``) against the two models' bytes, and the *floor* measured in the same run,
in a fresh process, on the same files:

- align: read both models once (every shard) + the products one sweep of weight
  matching needs (for every space outside heads, ``A_u B_u^T`` of each parameter axis it
  acts on, in float32) + one assignment (permutations) or one SVD (orthogonal maps) per
  space. No start, no second sweep, no spaces inside heads: a lower bound.
- merge: read both models once, average in float32, write one model in bfloat16.
- barrier: read both models once, then at each point put the interpolation into one
  float32 ``transformers`` model and compute its loss on the same test blocks.

Run: ``python benchmarks/real_size.py --size 307m [--work DIR] [--threads 2]
[--only align-permutation ...] [--max-sweeps N]`` (``--max-sweeps``: passed to ``lmckit
align``, to time a descent cut short). Targets: the 1.1B pair aligned (permutations, then
orthogonal) in under 10 minutes each, within 3x the floor; peak memory <= 1.5x the two
models' bytes + the largest cost matrices + the interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = {"307m": 4, "1.1b": 22}
SHAPE = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
TEXT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tinyshakespeare"
TASKS = ("align-permutation", "align-orthogonal", "merge", "barrier")


# --------------------------------------------------------------------------- building


def build(work: Path, layers: int, shard: str) -> None:
    """The tokenizer, the text and the two model folders (skipped when present)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    text = work / "text.txt"
    if not text.exists():
        # 60 kB of the play: a test split of ~1,000 tokens (blocks of 64)
        text.write_text((TEXT / "input.txt").read_text()[:60_000])
    tok_file = work / "tokenizer.json"
    if not tok_file.exists():
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=["<unk>"])
        tok.train([str(TEXT / "input.txt")], trainer)
        tok.save(str(tok_file))
    config = LlamaConfig(num_hidden_layers=layers, **SHAPE)
    for seed, name in enumerate("ab"):
        folder = work / name
        if (folder / "config.json").exists():
            continue
        torch.manual_seed(seed)
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(torch.float32)
        model.save_pretrained(folder, max_shard_size=shard)
        shutil.copy(tok_file, folder / "tokenizer.json")
        del model


def data_spec(work: Path) -> str:
    """The ``--data`` of the barrier: the text in blocks of 64 tokens."""
    return f"shakespeare:{work / 'text.txt'},tokenizer={work / 'tokenizer.json'},block=64"


def weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


# --------------------------------------------------------------------------- measuring


def measured(cmd: list[str], threads: int) -> tuple[float, int, str]:
    """Run ``cmd``; its wall time (s), peak RSS (bytes) and the end of its output."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    output = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{output}")
    lines = output.strip().splitlines()
    # align's report line (spaces, objective, sweeps), else the last line
    reports = [line for line in lines if " spaces, objective " in line] or lines[-1:]
    last = reports[-1] if reports else ""
    return seconds, usage.ru_maxrss * 1024, last


def lmckit_command(task: str, work: Path, threads: int, max_sweeps: int | None = None) -> list[str]:
    lmckit = [sys.executable, "-m", "lmckit"]
    a, b = str(work / "a"), str(work / "b")
    aligned = str(work / "aligned-permutation")
    data = data_spec(work)
    common = ["--threads", str(threads), "--quiet"]
    if task.startswith("align-"):
        symmetry = task.split("-", 1)[1]
        out = work / f"aligned-{symmetry}"
        shutil.rmtree(out, ignore_errors=True)
        sweeps = ["--max-sweeps", str(max_sweeps)] if max_sweeps else []
        return [*lmckit, "align", a, b, "--method", "weight", "--symmetry", symmetry,
                "--out", str(out), *sweeps, *common]  # fmt: skip
    if task == "merge":
        shutil.rmtree(work / "merged", ignore_errors=True)
        return [*lmckit, "merge", a, aligned, "--out", str(work / "merged"), *common[:2]]
    return [*lmckit, "barrier", a, aligned, "--data", data, *common]


# --------------------------------------------------------------------------- floors


def _read_all(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def floor_align(work: Path, symmetry: str) -> float:
    """Seconds of the align floor (module docstring); the spec is found untimed."""
    import numpy as np
    import torch

    from lmckit.formats._io import load_model
    from lmckit.forms._recipe import aligned_form
    from lmckit.groups import Orthogonal

    model = load_model(work / "a", dtype=None)
    form = aligned_form(model.module, model.params, model.params, symmetry=symmetry)
    spaces = [s for s in form.spec if s.nest is None]
    del model, form
    try:
        from lap import lapjvr  # the lapx package, as lmckit uses when installed

        def assign(cost: np.ndarray) -> object:
            return lapjvr(-cost, return_cost=False)
    except ImportError:
        from scipy.optimize import linear_sum_assignment

        def assign(cost: np.ndarray) -> object:
            return linear_sum_assignment(cost, maximize=True)

    start = time.perf_counter()
    a, b = _read_all(work / "a"), _read_all(work / "b")
    for space in spaces:
        sim = torch.zeros(space.n, space.n)
        for use in space.uses:
            if use.param not in a:
                continue
            x, y = a[use.param].float(), b[use.param].float()
            x = x.movedim(use.axis, 0).reshape(space.n, -1)
            y = y.movedim(use.axis, 0).reshape(space.n, -1)
            sim += x @ y.T
        if isinstance(space.group, Orthogonal):
            torch.linalg.svd(sim)
        else:
            assign(sim.double().numpy())
    return time.perf_counter() - start


def floor_merge(work: Path) -> float:
    import torch
    from safetensors.torch import save_file

    start = time.perf_counter()
    a, b = _read_all(work / "a"), _read_all(work / "aligned-permutation")
    merged = {k: ((a[k].float() + b[k].float()) / 2).to(torch.bfloat16) for k in a}
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        save_file(merged, str(Path(tmp) / "model.safetensors"))
    return time.perf_counter() - start


def floor_barrier(work: Path) -> float:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmckit.data import load_data

    data = load_data(data_spec(work))
    config = LlamaConfig.from_pretrained(work / "a")
    start = time.perf_counter()
    a, b = _read_all(work / "a"), _read_all(work / "aligned-permutation")
    model = LlamaForCausalLM(config).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for t in torch.linspace(0, 1, 11).tolist():
            for name, p in params.items():
                p.copy_(a[name].float() * (1 - t) + b[name].float() * t)
            for i in range(0, len(data.x_test), 32):
                logits = model(data.x_test[i : i + 32]).logits
                torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), data.y_test[i : i + 32].flatten()
                )
    return time.perf_counter() - start


def run_floor(task: str, work: Path) -> float:
    if task.startswith("align-"):
        return floor_align(work, task.split("-", 1)[1])
    return floor_merge(work) if task == "merge" else floor_barrier(work)


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="307m")
    parser.add_argument("--work", type=Path, default=None, help="folder kept between runs")
    parser.add_argument("--shard", default="500MB", help="max_shard_size of the folders")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", choices=TASKS, default=list(TASKS))
    parser.add_argument(
        "--max-sweeps",
        type=int,
        default=None,
        help="align: passed to lmckit align (default: its own)",
    )
    parser.add_argument("--floor", choices=TASKS, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    work = args.work or Path(tempfile.gettempdir()) / f"lmckit-real-size-{args.size}"
    if args.floor:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps({"seconds": run_floor(args.floor, work)}))
        return
    work.mkdir(parents=True, exist_ok=True)
    build(work, SIZES[args.size], args.shard)
    models = weight_bytes(work / "a") + weight_bytes(work / "b")
    gib = 2**30
    print(f"{args.size}: two bfloat16 models, {models / gib:.2f} GiB of weights, in {work}")
    for task in args.only:
        command = lmckit_command(task, work, args.threads, args.max_sweeps)
        seconds, rss, last = measured(command, args.threads)
        floor_cmd = [sys.executable, __file__, "--size", args.size, "--work", str(work),
                     "--threads", str(args.threads), "--floor", task]  # fmt: skip
        _, _, out = measured(floor_cmd, args.threads)
        floor = json.loads(out)["seconds"]
        print(f"{task}: {seconds:.1f} s, floor {floor:.1f} s, ratio {seconds / floor:.2f}; "
              f"peak RSS {rss / gib:.2f} GiB = {rss / models:.2f}x the models | {last}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
