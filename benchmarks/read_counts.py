"""How often one command reads each input file and traces a graph, counted from outside.

Builds tiny random Hugging Face folders (a Llama pair with grouped-query attention, a
GPT-2 pair) and runs, each in a fresh process under ``strace -f -e trace=open,openat``:

- ``lmckit align LLAMA_A LLAMA_B --out X``;
- ``lmckit align GPT2_A GPT2_B --symmetry orthogonal --out Y``;
- ``lmckit barrier`` and ``lmckit merge`` of the Llama pair.

It counts the successful opens of the inputs' ``config.json`` and of their
``*.safetensors`` files (the system calls, so every reader counts: Python, safetensors'
Rust, transformers), and the ``torch.export.export`` calls (a wrapper installed before
the command starts). Prints one table; ``--json P`` writes it too.

Run: ``python benchmarks/read_counts.py [--json counts.json]``. Needs ``strace`` and
``transformers``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: run by the child: count torch.export.export calls, then run the command line
CHILD = """
import atexit, os, sys
import torch.export
calls = [0]
real = torch.export.export
def counted(*args, **kwargs):
    calls[0] += 1
    return real(*args, **kwargs)
torch.export.export = counted
atexit.register(lambda: open(os.environ["TRACE_COUNT_FILE"], "w").write(str(calls[0])))
from lmckit.cli import main
sys.argv = ["lmckit", *sys.argv[1:]]
try:
    main()
except SystemExit as stop:
    if stop.code:
        raise
"""


def build(kind: str, path: Path, seed: int) -> Path:
    """A tiny random ``kind`` (``llama`` or ``gpt2``) folder at ``path``."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=61, hidden_size=32, num_hidden_layers=2, intermediate_size=37,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        )  # fmt: skip
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.GPT2Config(
            vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=2, n_inner=37,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        cls = transformers.GPT2LMHeadModel
    torch.manual_seed(seed)
    cls(config).eval().save_pretrained(path)
    return path


def count(args: list[str], inputs: list[Path], work: Path) -> dict[str, int]:
    """Opens of the inputs' config.json and safetensors files, and traces, of one run."""
    log, traces = work / "strace.log", work / "traces.txt"
    env = {**os.environ, "TRACE_COUNT_FILE": str(traces)}
    cmd = ["strace", "-f", "-qq", "-e", "trace=open,openat", "-o", str(log)]
    done = subprocess.run(
        [*cmd, sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    roots = [str(p.resolve()) for p in inputs]
    configs = weights = 0
    for line in log.read_text().splitlines():
        found = re.search(r'open(?:at)?\([^"]*"([^"]+)"', line)
        if not found or re.search(r"= -1 ", line):
            continue
        name = os.path.realpath(found.group(1))
        if not any(name.startswith(root + os.sep) for root in roots):
            continue
        configs += name.endswith(os.sep + "config.json")
        weights += name.endswith(".safetensors")
    return {"config_reads": configs, "weight_opens": weights, "traces": int(traces.read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if shutil.which("strace") is None:
        raise SystemExit("needs strace")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        la, lb = build("llama", work / "llama-a", 0), build("llama", work / "llama-b", 1)
        ga, gb = build("gpt2", work / "gpt2-a", 0), build("gpt2", work / "gpt2-b", 1)
        text = work / "text.txt"
        text.write_text("".join(chr(97 + (i * 7) % 26) for i in range(4000)))
        runs = {
            "Llama pair, align": (["align", la, lb, "--out", work / "o1"], [la, lb]),
            "GPT-2 pair, align --symmetry orthogonal": (
                ["align", ga, gb, "--symmetry", "orthogonal", "--out", work / "o2"],
                [ga, gb],
            ),
            "Llama pair, merge": (["merge", la, lb, "--out", work / "o3"], [la, lb]),
        }
        for name, (argv, inputs) in runs.items():
            rows[name] = count([str(a) for a in argv], inputs, work)
    width = max(map(len, rows))
    print(f"{'run':<{width}}  config.json reads  safetensors opens  torch.export traces")
    for name, row in rows.items():
        print(
            f"{name:<{width}}  {row['config_reads']:>17}  {row['weight_opens']:>17}"
            f"  {row['traces']:>19}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
