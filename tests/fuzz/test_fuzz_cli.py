"""The command line against hostile and clumsy input: every case found, as one table.

Every case asserts the exit code, a message fragment, that no traceback was printed
(and no exception escaped), that a failure ends in one ``Error: ...`` line, and that
nothing in the world folder changed except the case's own fresh output path.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmckit.cli import main

TEXT = "text:{w}/data/corpus.txt,tokenizer={w}/data/tok"
TRAIN = ["train", "--model", "mlp", "--data", "digits", "--width", "8", "--depth", "1",
         "--epochs", "1", "--quiet"]  # fmt: skip
A, B, C = "{w}/ckpt/a", "{w}/ckpt/b", "{w}/ckpt/c"


def _barrier(x: str, y: str, *extra: str, data: str = "digits") -> list[str]:
    return ["barrier", f"{{w}}/ckpt/{x}", f"{{w}}/ckpt/{y}", "--data", data, "--quiet", *extra]


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    import lmckit.formats._checkpoint

    def half_write(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lmckit.formats._checkpoint, "save_file", half_write)


def _ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    import lmckit.workflow._train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lmckit.workflow._train, "fit", interrupted)


@dataclass(frozen=True)
class Case:
    id: str
    args: list[str]
    code: int
    fragment: str
    cwd: str | None = None
    patch: Callable[[pytest.MonkeyPatch], None] | None = None


CASES = [
    # --- data loss: outputs never destroy inputs or a user's folders
    Case("train-out-user-folder", [*TRAIN, "--out", "{w}/user"], 1, "refusing to replace"),
    Case("align-out-user-folder", ["align", A, B, "--out", "{w}/user", "--quiet"], 1,
         "refusing to replace"),
    Case("merge-out-user-folder", ["merge", A, B, "--out", "{w}/user"], 1, "refusing to replace"),
    Case("train-out-cwd", [*TRAIN, "--out", ".", "--force"], 1, "working directory", cwd="work"),
    Case("train-out-cwd-absolute", [*TRAIN, "--out", "{w}/work", "--force"], 1,
         "working directory", cwd="work"),
    Case("merge-out-is-input", ["merge", A, B, "--out", A], 1, "is an input"),
    Case("align-out-is-input", ["align", A, B, "--out", B, "--force", "--quiet"], 1,
         "is an input"),
    Case("align-out-inside-input", ["align", A, B, "--out", A + "/nested", "--force"], 1,
         "inside the input"),
    Case("barrier-json-into-input", _barrier("a", "b", "--json", A + "/config.json"), 1,
         "inside the input"),
    Case("barrier-plot-into-input", _barrier("a", "b", "--plot", B + "/model.safetensors"), 1,
         "inside the input"),
    Case("align-out-user-reference", ["align", A, B, "--out", "{w}/ckpt/with_ref", "--quiet"], 1,
         "its reference/ is not a folder lmckit wrote"),
    Case("merge-out-user-reference", ["merge", A, B, "--out", "{w}/ckpt/with_ref"], 1,
         "its reference/ is not a folder lmckit wrote"),
    Case("barrier-json-plot-same-path", _barrier("a", "b", "--json", "{o}.png", "--plot",
                                                 "{o}.png"), 1, "--json and --plot both name"),
    Case("demo-json-plot-same-path", ["demo", "--json", "{o}.png", "--plot", "{o}.png"], 1,
         "--json and --plot both name"),
    # --- resources: validation before allocation, bounded reads
    Case("config-hidden-50000", _barrier("a", "big_config"), 1,
         "parameter 'layers.1.weight' of 'mlp' is missing"),
    Case("train-width-50000", [*TRAIN, "--width", "50000", "--depth", "3", "--out", "{o}"], 1,
         "GiB available"),
    Case("train-width-1e12", [*TRAIN, "--width", str(10**12), "--out", "{o}"], 1,
         "GiB available"),
    Case("config-trillion-layers", _barrier("gpt_src", "gpt_layers", data=TEXT + ",block=8"), 1,
         "n_layer is 1000000000000, but the weights file holds only 16 tensors"),
    Case("config-is-dev-zero", _barrier("a", "devzero"), 1, "is a device"),
    Case("config-is-fifo", _barrier("a", "fifo"), 1, "is a FIFO"),
    Case("mnist-gzip-declares-7gb", [*TRAIN, "--data", "mnist:{w}/data/mnist_bomb", "--out",
                                     "{o}"], 1, "declares 7,840,000,016 bytes"),
    Case("mnist-gzip-expands-64mb", [*TRAIN, "--data", "mnist:{w}/data/mnist_trail", "--out",
                                     "{o}"], 1, "trailing bytes"),
    Case("gmm-billion-classes", _barrier("a", "b", data="gmm:classes=1000000000"), 1,
         "needs 8,000,200,256 values, more than the 134,217,728 allowed"),
    Case("gmm-billion-samples", _barrier("a", "b", data="gmm:n=1000000000"), 1,
         "more than the 134,217,728 allowed"),
    Case("simplex-huge-resolution", ["barrier", A, B, C, "--simplex", "--resolution",
                                     "100000000", "--data", "digits"], 1, "grid points"),
    Case("simplex-resolution-over-cap", ["barrier", A, B, C, "--simplex", "--resolution", "500",
                                         "--data", "digits"], 1, "125,751 grid points"),
    Case("path-huge-points", _barrier("a", "b", "--points", "100000000"), 1,
         "points must be between 3 and 10001"),
    # --- silent wrong results become errors
    Case("int32-weights", _barrier("a", "int32"), 1, "'layers.0.weight' is stored as I32"),
    Case("bool-weights", _barrier("a", "bool"), 1, "'head.bias' is stored as BOOL"),
    Case("data-fewer-classes", _barrier("a", "b", data="gmm:dim=64,classes=5"), 1,
         "the model has 10 outputs (classes) but gmm has 5 classes"),
    Case("data-more-classes", _barrier("five", "five"), 1,
         "the model has 5 outputs (classes) but digits has 10 classes"),
    Case("train-width-0", [*TRAIN, "--width", "0", "--out", "{o}"], 2, "--width"),
    Case("train-depth-negative", [*TRAIN, "--depth", "-1", "--out", "{o}"], 2, "--depth"),
    Case("barrier-points-2", _barrier("a", "b", "--points", "2"), 1,
         "with 2 the barrier is 0 by definition"),
    Case("barrier-points-even", _barrier("a", "b", "--points", "4"), 1,
         "points must be odd, so that t = 0.5 is a point of the path"),
    Case("simplex-resolution-1", ["barrier", A, B, C, "--simplex", "--resolution", "1", "--data",
                                  "digits", "--quiet"], 1, "resolution must be >= 2"),
    Case("simplex-no-centroid-on-grid", ["barrier", A, B, C, "--simplex", "--resolution", "2",
                                         "--data", "digits", "--quiet"], 0,
         "no centroid on this grid (--resolution 2 is not a multiple of 3)"),
    Case("simplex-centroid-on-grid", ["barrier", A, B, C, "--simplex", "--resolution", "3",
                                      "--data", "digits", "--quiet"], 0, "centroid loss"),
    # --- user mistakes that used to print tracebacks
    Case("data-input-size", _barrier("mnist_mlp", "mnist_mlp"), 1,
         "takes 784 input features but digits's inputs (1, 8, 8) have 64"),
    Case("merge-data-classes", ["merge", "{w}/ckpt/five", "{w}/ckpt/five", "--data", "digits",
                                "--out", "{o}"], 1, "5 outputs (classes)"),
    Case("float16-barrier", _barrier("a", "half"), 0, "linear"),
    Case("bfloat16-merge-data", ["merge", A, "{w}/ckpt/bf16", "--data", "digits", "--out",
                                 "{o}"], 0, "merged model: test loss"),
    Case("float16-activation-align", ["align", A, "{w}/ckpt/half", "--method", "activation",
                                      "--data", "digits", "--out", "{o}", "--quiet"], 0, "wrote"),
    Case("config-negative-width", _barrier("a", "neg_config"), 1,
         "hidden[0] must be a positive integer, got -5"),
    Case("config-huge-width", _barrier("a", "huge_config"), 1, "cannot build mlp"),
    Case("config-quoted-width", _barrier("a", "quoted_config"), 1,
         "hidden must be a list of positive integers, got '16' (a string: write a list"),
    Case("train-mlp-dropout", [*TRAIN, "--dropout", "0.1", "--out", "{o}"], 1,
         "dropout is for gpt2 only; mlp has no dropout"),
    Case("cli-negative-width", [*TRAIN, "--width", "-3", "--out", "{o}"], 2, "--width"),
    Case("disk-full", ["align", A, B, "--out", "{o}", "--quiet"], 1,
         "could not write output: [Errno 28] No space left on device", patch=_disk_full),
    Case("align-out-dot", ["align", A, B, "--out", ".", "--quiet"], 1, "working directory",
         cwd="work"),
    Case("align-out-empty", ["align", A, B, "--out", "", "--quiet"], 1, "empty path"),
    Case("threads-negative", _barrier("a", "b", "--threads", "-1"), 2, "--threads"),
    Case("plot-unknown-extension", _barrier("a", "b", "--plot", "{o}.xyz"), 1,
         "unknown file type '.xyz'"),
    Case("corrupt-tokenizer", ["train", "--model", "gpt2", "--data",
                               "text:{w}/data/corpus.txt,tokenizer={w}/data/bad_tok",
                               "--out", "{o}"], 1, "not a valid tokenizer.json"),
    Case("config-deeply-nested", _barrier("a", "nested"), 1, "nested too deeply"),
    Case("config-huge-integer", _barrier("a", "hugeint"), 1, "is not valid JSON"),
    Case("truncated-safetensors", _barrier("a", "trunc"), 1, "corrupt or truncated"),
    Case("ctrl-c-while-training", [*TRAIN, "--out", "{o}"], 130, "interrupted", patch=_ctrl_c),
    # --- data and model fit, language models with any local tokenizer
    Case("vocab-data-larger", _barrier("gpt_small", "gpt_small", data=TEXT + ",block=8"), 1,
         "the model's vocabulary has 5 tokens but text's tokenizer has 9"),
    Case("vocab-model-larger", _barrier("gpt_big", "gpt_big", data=TEXT + ",block=8"), 1,
         "the model's vocabulary has 20 tokens but text's tokenizer has 9"),
    Case("block-longer-than-context", _barrier("gpt_ok", "gpt_ok2", data=TEXT + ",block=16"), 1,
         "blocks of 16 tokens but the model's context is 8"),
    Case("mlp-on-token-data", _barrier("a", "b", data=TEXT + ",block=8"), 1, "holds token ids"),
    Case("gpt2-barrier-word-tokenizer", _barrier("gpt_ok", "gpt_ok2", data=TEXT + ",block=8"), 0,
         "linear"),
    Case("gpt2-train-word-tokenizer", ["train", "--model", "gpt2", "--data", TEXT + ",block=8",
                                       "--n-layer", "1", "--n-head", "2", "--n-embd", "8",
                                       "--batch-size", "8", "--max-steps", "3", "--quiet",
                                       "--out", "{o}"], 0, "test loss"),
    # --- Hugging Face folders checked like lmckit's own checkpoints
    Case("hf-config-differs", ["barrier", "{w}/hf/gpt_a", "{w}/hf/gpt_relu", "--data",
                               TEXT + ",block=8", "--quiet"], 1,
         "their configs differ in activation_function: 'gelu_new' vs 'relu' (and 1 more)"),
    Case("hf-million-layers", ["barrier", "{w}/hf/gpt_a", "{w}/hf/gpt_layers", "--data",
                               TEXT + ",block=8", "--quiet"], 1,
         "n_layer is 1000000, but the weights hold only 16 tensors"),
    Case("hf-million-layers-symmetries", ["symmetries", "{w}/hf/gpt_layers"], 1,
         "n_layer is 1000000, but the weights hold only 16 tensors"),
    Case("hf-vocab-2e7", ["barrier", "{w}/hf/gpt_a", "{w}/hf/gpt_vocab", "--data",
                          TEXT + ",block=8", "--quiet"], 1,
         "weight transformer.wte.weight has shape (9, 16), but a GPT2LMHeadModel of this "
         "config expects (20000000, 16)"),
    Case("hf-vocab-1e9-symmetries", ["symmetries", "{w}/hf/gpt_vocab_1e9"], 1,
         "expects (1000000000, 16)"),
    # with itself: beside a float32 folder it is refused first for its storage
    Case("hf-float64-overflow", ["barrier", "{w}/hf/gpt_f64", "{w}/hf/gpt_f64", "--data",
                                 TEXT + ",block=8", "--quiet"], 1,
         "weight 'transformer.h.0.mlp.c_fc.bias' overflows torch.float32"),
    Case("hf-symlink-out-of-folder", ["merge", "{w}/hf/gpt_links", "{w}/hf/gpt_b", "--out",
                                      "{o}"], 0, "wrote"),
    Case("hf-masked-lm-on-text", ["barrier", "{w}/hf/bert", "{w}/hf/bert", "--data",
                                  TEXT + ",block=8", "--quiet"], 1,
         "BertForMaskedLM is not a causal language model"),
    Case("float64-overflow", _barrier("a", "overflow"), 1,
         "parameter 'head.bias' overflows torch.float32"),
    # --- devices that cannot run
    Case("train-device-meta", [*TRAIN, "--device", "meta", "--out", "{o}"], 1,
         "--device meta: cannot compute there (Cannot copy out of meta tensor"),
    Case("align-learned-device-meta", ["align", A, B, "--method", "learned", "--data", "digits",
                                       "--device", "meta", "--out", "{o}", "--quiet"], 1,
         "--device meta: cannot compute there"),
    # --- minor
    Case("trainconfig-names-field", [*TRAIN, "--lr", "0", "--out", "{o}"], 1,
         "lr must be a positive number, got 0.0"),
    Case("huge-seed", [*TRAIN, "--seed", str(2**70), "--out", "{o}"], 2, "--seed"),
    Case("text-unknown-option", _barrier("gpt_ok", "gpt_ok2", data=TEXT + ",blok=8"), 1,
         "unknown text option 'blok'"),
    Case("out-under-a-file", [*TRAIN, "--out", "{w}/user/notes.txt/model", "--epochs", "50"], 1,
         "is not a folder"),
    Case("align-weight-bad-data", ["align", A, B, "--data", "nonsense", "--out", "{o}"], 1,
         "unknown dataset 'nonsense'"),
    Case("align-weight-missing-data", ["align", A, B, "--data", "mnist:{w}/nowhere", "--out",
                                       "{o}"], 1, "is not a directory"),
    Case("align-weight-missing-text", ["align", A, B, "--data", "text:{w}/none.txt,tokenizer="
                                       "{w}/data/tok", "--out", "{o}"], 1, "does not exist"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: Case, world: Path, snap, monkeypatch: pytest.MonkeyPatch) -> None:
    out = world / "outs" / case.id
    args = [a.format(w=world, o=out) for a in case.args]
    if case.cwd:
        monkeypatch.chdir(world / case.cwd)
    if case.patch:
        case.patch(monkeypatch)
    before = snap(world)
    result = CliRunner().invoke(main, args)
    after = snap(world)
    text = result.output
    assert result.exit_code == case.code, text
    assert "Traceback" not in text, text
    assert result.exception is None or isinstance(result.exception, SystemExit), text
    assert case.fragment in text, text
    if case.code:
        last = text.strip().splitlines()[-1]
        assert last == "interrupted" if case.code == 130 else last.startswith("Error: "), text
    prefix = str(out.relative_to(world))
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert {k for k in changed if not k.startswith(prefix)} == set(), changed
    if case.code:
        assert not any(k.startswith(prefix) for k in after), "a failed command left output"


def test_the_table_has_every_case_once() -> None:
    assert len(CASES) == len({c.id for c in CASES})
    assert sum(c.code == 0 for c in CASES) >= 5 and sum(c.code != 0 for c in CASES) >= 40
