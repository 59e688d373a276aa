"""A curve, a plane and an ensemble between two small causal language models (Hugging Face
folders, random weights) on ``text:`` data tokenised with GPT-2's tokenizer: the points are
written as folders ``transformers`` loads, and the curve fitted on text lowers the loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from tests.tiny_models import build_hf_folder

from lmckit.cli import main
from lmckit.formats._io import load_model

TOKENIZER = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gpt2_tokenizer"
pytestmark = pytest.mark.skipif(
    not (TOKENIZER / "tokenizer.json").is_file(), reason=f"no GPT-2 tokenizer at {TOKENIZER}"
)
WORDS = ("the king and the queen walk in the garden of the castle while the fool sings "
         "a song of the sea and the wind and the rain ").split()  # fmt: skip


def _ok(*args: str | Path) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, f"{args}: {result.output}\n{result.exception!r}"
    return result


@pytest.fixture(scope="module")
def lms(tmp_path_factory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("lms")
    kw = dict(vocab_size=50257, hidden_size=16, intermediate_size=24, max_position_embeddings=16)
    a = build_hf_folder("llama", root / "a", seed=0, **kw)
    b = build_hf_folder("llama", root / "b", seed=1, **kw)
    gen = torch.Generator().manual_seed(0)
    text = " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (1500,), generator=gen))
    (root / "text.txt").write_text(text)
    return a, b, f"text:{root / 'text.txt'},tokenizer={TOKENIZER},block=16,split=80/10/10"


def test_a_curve_between_language_models_is_written_as_their_folders(lms, tmp_path) -> None:
    import transformers

    a, b, spec = lms
    _ok("curve", a, b, "--data", spec, "--epochs", "2", "--batch-size", "8", "--lr", "1e-2",
        "--points", "3", "--out", tmp_path / "curve", "--json", tmp_path / "c.json",
        "--quiet")  # fmt: skip
    path = json.loads((tmp_path / "c.json").read_text())
    # trained on the text, the curve's middle predicts it far better than the line's,
    # which averages two random networks
    assert path["midpoint_loss"] < path["linear"]["midpoint_loss"] - 1.0
    point = tmp_path / "curve" / "control-1"
    ours = load_model(point)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(point).eval()
    ids = torch.randint(50257, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = torch.func.functional_call(ours.module, ours.params, (ids,)).logits
        torch.testing.assert_close(theirs(ids).logits, expected)
    # the plane through both models and the curve's control point, with the curve drawn
    _ok("landscape", a, b, tmp_path / "curve", "--data", spec, "--resolution", "3",
        "--json", tmp_path / "l.json", "--plot", tmp_path / "l.png", "--quiet")  # fmt: skip
    plane = json.loads((tmp_path / "l.json").read_text())
    for entry in plane["models"]:
        assert entry["plane_loss"] == pytest.approx(entry["loss"], rel=1e-4)
    assert plane["curve"] and len(plane["grid"]["loss"]) == 3
    _ok("ensemble", tmp_path / "curve", "--data", spec, "--points", "3", "--json",
        tmp_path / "e.json", "--quiet")  # fmt: skip
    ensemble = json.loads((tmp_path / "e.json").read_text())
    assert ensemble["ensemble"]["loss"] < max(e["loss"] for e in ensemble["endpoints"])
