"""Read once, trace once: what ``lmckit align`` opens and traces, counted.

Each run is a fresh interpreter (no file read or graph traced before it), which counts
what the command does: the opens of each input's ``config.json`` and ``*.safetensors``
files (Python's ``open``, seen by an audit hook, and ``safetensors``' own opens, through
a wrapper of ``safe_open``) and the ``torch.export.export`` calls. The targets are issue
41's: each config read once, each weight file once and its header once more, each
distinct graph traced once (a Llama has one; a GPT-2 aligned under orthogonal maps is
traced in lmckit's form of it, its RMSNorm form and its circuit form). Before: Llama 6
config reads, 12 safetensors opens, 1 trace; GPT-2 orthogonal 8, 16, 8 (BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.tiny_models import build_hf_folder

ROOT = Path(__file__).resolve().parents[2]

#: run by the child: count, then run the command line in this process
CHILD = """
import json, os, sys
roots = [os.path.realpath(p) + os.sep for p in sys.argv[1:3]]
counts = {"config_reads": 0, "weight_opens": 0, "traces": 0}

def note(path):
    name = os.path.realpath(os.fspath(path))
    if any(name.startswith(root) for root in roots):
        counts["config_reads"] += name.endswith(os.sep + "config.json")
        counts["weight_opens"] += name.endswith(".safetensors")

def hook(event, args):
    if event == "open" and isinstance(args[0], (str, os.PathLike)):
        note(args[0])

sys.addaudithook(hook)
import safetensors, safetensors.torch, torch.export
real_open, real_export = safetensors.safe_open, torch.export.export

def safe_open(filename, *args, **kwargs):
    note(filename)
    return real_open(filename, *args, **kwargs)

def export(*args, **kwargs):
    counts["traces"] += 1
    return real_export(*args, **kwargs)

safetensors.safe_open = safetensors.torch.safe_open = safe_open
torch.export.export = export
from lmckit.cli import main
try:
    main(["align", *sys.argv[1:]], standalone_mode=False)
finally:
    print("COUNTS " + json.dumps(counts))
"""


def _counts(a: Path, b: Path, *args: str) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(a), str(b), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(s for s in done.stdout.splitlines() if s.startswith("COUNTS "))
    return json.loads(line.removeprefix("COUNTS "))


@pytest.mark.parametrize(
    "family, symmetry, most",
    [
        ("llama", None, {"config_reads": 2, "weight_opens": 4, "traces": 1}),
        ("gpt2", "orthogonal", {"config_reads": 2, "weight_opens": 4, "traces": 3}),
    ],
)
def test_each_file_read_once_and_each_graph_traced_once(tmp_path, family, symmetry, most):
    a = build_hf_folder(family, tmp_path / "a", seed=0)
    b = build_hf_folder(family, tmp_path / "b", seed=1)
    extra = ["--symmetry", symmetry] if symmetry else []
    counts = _counts(a, b, "--out", str(tmp_path / "out"), "--quiet", *extra)
    assert (tmp_path / "out" / "config.json").is_file()  # the run wrote its folder
    for what, limit in most.items():
        assert counts[what] <= limit, counts
    # every file was read: the counts count what they say
    assert counts["config_reads"] >= 2 and counts["weight_opens"] >= 2, counts
