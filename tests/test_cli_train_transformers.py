"""`lmckit train --model gpt2|vit`: the CPU-sized pipeline on Tiny Shakespeare, and errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmckit.cli import main
from lmckit.data import batches, load_data
from lmckit.formats._checkpoint import load
from lmckit.measure._evaluate import evaluate

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SHAKESPEARE = SHARED / "tinyshakespeare" / "input.txt"
GPT2_TOKENIZER = SHARED / "gpt2_tokenizer"
# Blocks of 16 tokens; 0.5 % of the tokens (~1,700) each for validation and test keep
# every evaluation over the 50,257-token vocabulary cheap.
TINY_SHAKESPEARE = f"shakespeare:{SHAKESPEARE},tokenizer={GPT2_TOKENIZER},block=16,split=99/0.5/0.5"


def _train(tmp_path: Path, *args: str) -> tuple[object, Path]:
    out = tmp_path / "model"
    result = CliRunner().invoke(main, ["train", *args, "--out", str(out), "--quiet"])
    return result, out


@pytest.mark.skipif(
    not (SHAKESPEARE.is_file() and GPT2_TOKENIZER.is_dir()), reason="shared data absent"
)
def test_gpt2_on_tiny_shakespeare(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    result, out = _train(
        tmp_path,
        *("--model", "gpt2", "--data", TINY_SHAKESPEARE),
        *("--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--n-inner", "32"),
        *("--optimizer", "adamw", "--lr", "1e-2", "--weight-decay", "0.01", "--warmup", "0.1"),
        *("--batch-size", "8", "--max-steps", "12", "--eval-every", "4", "--patience", "2"),
        *("--grad-clip", "1.0", "--eval-batch-size", "64"),
    )
    assert result.exit_code == 0, result.output
    assert "best validation loss" in result.output
    ckpt = load(out)
    meta = ckpt.config.kwargs
    assert ckpt.config.name == "gpt2" and meta["vocab_size"] == 50257 and meta["context"] == 16
    info = json.loads((out / "config.json").read_text())["metadata"]
    assert info["steps"] == 12 and info["train"]["patience"] == 2
    # Twelve steps already beat the uniform prediction, ln(vocab) nats per token.
    assert info["val_loss"] < math.log(50257) - 0.3
    # The checkpoint holds the best validated parameters, and its recorded test loss.
    data = load_data(TINY_SHAKESPEARE)
    val = evaluate(ckpt.module, ckpt.params, batches(*data.split("val"), 64))
    test = evaluate(ckpt.module, ckpt.params, batches(*data.split("test"), 64))
    assert val.loss == pytest.approx(info["val_loss"], rel=1e-5)
    assert test.loss == pytest.approx(info["test_loss"], rel=1e-5)


def test_vit_on_digits(tmp_path: Path) -> None:
    result, out = _train(
        tmp_path,
        *("--model", "vit", "--data", "digits", "--patch-size", "4", "--norm", "rms"),
        *("--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--epochs", "3"),
        *("--optimizer", "adamw", "--lr", "3e-3", "--batch-size", "64"),
    )
    assert result.exit_code == 0, result.output
    ckpt = load(out)
    assert ckpt.config.kwargs["image_size"] == 8 and ckpt.config.kwargs["norm"] == "rms"
    info = json.loads((out / "config.json").read_text())["metadata"]
    assert info["test_acc"] > 0.5  # ten classes: chance is 0.1
    assert "val_loss" not in info  # no validation without --patience / --eval-every


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt2", "--data", "digits"], "gpt2 needs token data"),
        (["--model", "vit", "--data", "gmm"], "vit needs square images"),
        (["--model", "vit", "--data", "digits", "--norm", "batch"], "--norm layer or rms"),
        (["--model", "vit", "--data", "digits", "--patch-size", "3"], "not a multiple of patch"),
        (["--model", "mlp", "--data", "digits", "--patience", "2"], "validation split"),
        (["--model", "mlp", "--data", "digits", "--device", "nonsense"], "bad --device"),
    ],
)
def test_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result, out = _train(tmp_path, *args, "--epochs", "1")
    assert result.exit_code == 1 and message in result.output, result.output
    assert not out.exists()


@pytest.mark.skipif(
    not (SHAKESPEARE.is_file() and GPT2_TOKENIZER.is_dir()), reason="shared data absent"
)
def test_token_data_errors(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    for args, message in [
        (["--model", "gpt2", "--context", "8"], "shorter than the data's blocks of 16"),
        (["--model", "mlp"], "holds token ids"),
    ]:
        result, _ = _train(tmp_path, *args, "--data", TINY_SHAKESPEARE, "--max-steps", "1")
        assert result.exit_code == 1 and message in result.output, result.output
