"""`lmckit align / barrier / merge` on Hugging Face folders, end to end.

For every family: B is A moved by a random element of A's inferred symmetries (written
as a Hugging Face folder); ``lmckit align A B --out OUT`` must recover A's weights, and
OUT must load with ``AutoModel*.from_pretrained`` and compute B's logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from lmckit.cli import main
from lmckit.forms._recipe import aligned_form
from lmckit.hf import example_inputs, load_hf, save_hf
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import apply

RMS_NATIVE = ("llama", "mistral")


def _invoke(*args: object):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def _distance(a: dict, b: dict) -> float:
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a).sqrt())


def _moved_copy(folder: Path, out: Path, symmetry: str | None, seed: int = 5) -> tuple:
    """B = a random element of A's (aligned-form) symmetries applied to A; A's form too."""
    model = load_hf(folder)
    form = aligned_form(model.module, model.params, model.params, symmetry=symmetry)
    moved = apply(form.spec, form.a, random_transform(form.spec, seed=seed))
    save_hf(out, model, moved)
    return form.a, moved


@pytest.mark.parametrize("symmetry", [None, "orthogonal"])
def test_align_recovers_a_moved_copy_and_writes_a_loadable_folder(
    family, symmetry, hf_folder, load_with_transformers, tmp_path, logits
) -> None:
    if symmetry == "orthogonal" and family not in RMS_NATIVE:
        pytest.skip("orthogonal residual maps written back: RMSNorm-native families")
    a_path = hf_folder(family)
    a_form, moved = _moved_copy(a_path, tmp_path / "b", symmetry)
    out = tmp_path / "out"
    # heads as projections (GPT-2 and ViT folders are otherwise aligned as circuits,
    # written as lmckit checkpoints): the folder's own class is written back
    extra = ["--symmetry", symmetry] if symmetry else []
    args = ["--method", "weight", *extra, "--no-circuits", "--out", out, "--quiet"]
    _invoke("align", a_path, tmp_path / "b", *args)
    aligned = load_hf(out)
    before, after = _distance(moved, a_form), _distance(aligned.params, a_form)
    assert before > 1.0 and after / before < 1e-4
    reloaded = load_with_transformers(family, out)
    b = load_with_transformers(family, tmp_path / "b")
    x = example_inputs(aligned)[0]
    assert float((logits(reloaded, x) - logits(b, x)).abs().max()) < 1e-4
    meta = json.loads((out / "lmckit.json").read_text())
    assert meta["metadata"]["method"] == "weight_matching"


def test_orthogonal_on_a_layernorm_folder_says_why(hf_folder, tmp_path) -> None:
    a = hf_folder("bert")
    result = CliRunner().invoke(
        main, ["align", str(a), str(a), "--symmetry", "orthogonal", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1 and "LayerNorm" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()


def test_barrier_and_merge_on_folders(hf_folder, load_with_transformers, tmp_path, logits) -> None:
    a = hf_folder("llama")
    _, _ = _moved_copy(a, tmp_path / "b", None)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    tok = _char_tokenizer(tmp_path / "tok", text)
    data = f"text:{text},tokenizer={tok},block=8"
    _invoke("barrier", a, tmp_path / "b", "--data", data, "--points", "3",
            "--json", tmp_path / "p.json", "--quiet")  # fmt: skip
    path = json.loads((tmp_path / "p.json").read_text())
    # B is A moved by a symmetry: the same function at both ends
    assert path["loss"][0] == pytest.approx(path["loss"][-1], rel=1e-4)
    _invoke("merge", a, a, "--out", tmp_path / "m")
    merged = load_with_transformers("llama", tmp_path / "m")
    x = torch.randint(0, 20, (2, 8))
    assert torch.allclose(logits(merged, x), logits(load_with_transformers("llama", a), x))


def _char_tokenizer(folder: Path, text: Path) -> Path:
    """A word-level tokenizer.json with ids below the tiny models' vocabulary (61)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set(text.read_text().split()))
    vocab = {w: i for i, w in enumerate(["[UNK]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder
