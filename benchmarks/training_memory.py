"""Benchmark: the peak memory of ``train_model`` against what ``lmckit.models._memory`` counts.

Each run trains a zoo model for 3 steps (weight decay 0.01, one thread) in a process of
its own and reads its resident peak from ``/proc/self/status`` (``VmHWM``, reset with
``/proc/self/clear_refs`` after the data are loaded), then prints it beside the count
made on the meta device before training: the state dict, the activations counted, the
measured peak, the count and their ratio. The token runs read a text of 20,000 words
written here and a 10-word word-level tokenizer (needs ``tokenizers``).

Run: ``python benchmarks/training_memory.py [RUN ...]`` (Linux; default: every run).
The table in ``docs/reliability.md`` ("Third pass: Memory") comes from it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

#: name -> (architecture, data: "text" or "digits", ModelOptions keywords, batch, optimiser,
#: early stopping)
RUNS: dict[str, tuple[str, str, dict, int, str, bool]] = {
    "gpt2-context-2e6": ("gpt2", "text", dict(n_layer=1, n_head=2, n_embd=16,
                                              context=2_000_000), 32, "adam", False),
    "gpt2-context-2e6-val": ("gpt2", "text", dict(n_layer=1, n_head=2, n_embd=16,
                                                  context=2_000_000), 32, "adam", True),
    "gpt2-4x384": ("gpt2", "text", dict(n_layer=4, n_head=4, n_embd=384), 32, "adam", False),
    "gpt2-4x384-val": ("gpt2", "text", dict(n_layer=4, n_head=4, n_embd=384), 128, "adam", True),
    "mlp-4000x2": ("mlp", "digits", dict(width=4000, depth=2), 128, "adam", False),
    "mlp-4000x2-sgd": ("mlp", "digits", dict(width=4000, depth=2), 128, "sgd", False),
    "mlp-64x2": ("mlp", "digits", dict(width=64, depth=2), 1437, "adam", False),
    "resnet20x4": ("resnet20", "digits", dict(width_mult=4), 512, "adam", False),
    "vit-4x128": ("vit", "digits", dict(n_layer=4, n_embd=128, patch_size=2), 512, "adam", False),
}  # fmt: skip
WORDS = ["<unk>", "the", "a", "cat", "dog", "sat", "on", "mat", "and", "ran"]


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _text(folder: Path) -> str:
    import tokenizers

    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    draw = random.Random(0)
    (folder / "corpus.txt").write_text(" ".join(draw.choice(WORDS[1:]) for _ in range(20_000)))
    return f"text:{folder / 'corpus.txt'},tokenizer={folder},block=32"


def measure(name: str, folder: Path) -> dict[str, object]:
    """One run in this process: its measured peak and its count, in MiB."""
    import torch

    from lmckit.data import load_data
    from lmckit.models._memory import training_memory
    from lmckit.models._sizing import ModelOptions, sized_config
    from lmckit.training._train import TrainConfig
    from lmckit.workflow import train_model

    arch, source, options, batch, optimizer, validate = RUNS[name]
    torch.set_num_threads(1)
    data = load_data(_text(folder) if source == "text" else "digits")
    config = sized_config(arch, input_shape=data.input_shape, num_classes=data.num_classes,
                          tokens=data.is_language, options=ModelOptions(**options))  # fmt: skip
    train = TrainConfig(epochs=1, max_steps=3, batch_size=batch, optimizer=optimizer,
                        weight_decay=0.01, patience=2 if validate else None)  # fmt: skip
    need = training_memory(config, input_shape=data.input_shape, tokens=data.is_language,
                           batch_size=min(batch, len(data.x_train)))  # fmt: skip
    Path("/proc/self/clear_refs").write_text("5")
    base = _rss("VmRSS:")
    train_model(config, data, train, seed=0)
    peak = _rss("VmHWM:") - base
    mib = 2**20
    return {"run": name, "batch": batch, "optimizer": optimizer, "validate": validate,
            "state_MiB": round(need.parameters / mib, 2),
            "activations_MiB": round(need.activations / mib, 1),
            "peak_MiB": round(peak / mib, 1), "count_MiB": round(need.total / mib, 1),
            "peak/count": round(peak / need.total, 3),
            "peak/state": round(peak / need.parameters, 2)}  # fmt: skip


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        with tempfile.TemporaryDirectory() as folder:
            print(json.dumps(measure(sys.argv[2], Path(folder))))
        return
    for name in sys.argv[1:] or list(RUNS):
        done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True,
                              text=True, check=True)  # fmt: skip
        print(done.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
