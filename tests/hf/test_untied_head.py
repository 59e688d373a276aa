"""An output head tied to the embedding reads the final norm: with ``--symmetry
orthogonal`` the head is untied (its own copy takes the norm's scale) so the residual
stream admits rotations; the folder written is the family's own class, untied, with B's
function. The caller's module stays tied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from lmckit.cli import main
from lmckit.forms._recipe import aligned_form
from lmckit.hf import example_inputs, load_hf


@pytest.mark.parametrize("name", ["gemma", "opt", "falcon"])
def test_two_tied_models_are_aligned_with_a_rotated_stream_and_written_untied(
    name: str, hf_folder_pair, load_with_transformers, logits, tmp_path: Path
) -> None:
    a, b = hf_folder_pair(name)
    assert json.loads((b / "config.json").read_text()).get("tie_word_embeddings", True)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        ["align", str(a), str(b), "--method", "weight", "--symmetry", "orthogonal",
         "--no-circuits", "--out", str(out), "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "lmckit.json").read_text())["metadata"]
    assert "lm_head.weight untied" in meta["form"]
    assert "residual" in meta["spaces"]
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    aligned = load_hf(out)
    embedding = next(k for k in aligned.params if "embed" in k and k.endswith("weight"))
    assert not torch.equal(aligned.params["lm_head.weight"], aligned.params[embedding])
    x = example_inputs(aligned)
    want = logits(load_with_transformers(name, b), x)
    got = logits(load_with_transformers(name, out), x)
    assert float((got - want).abs().max()) < 1e-4 * max(float(want.abs().max()), 1.0)


def test_untying_leaves_the_callers_module_tied(hf_folder) -> None:
    model = load_hf(hf_folder("gemma"))
    head, embedding = model.module.lm_head, model.module.get_input_embeddings()
    form = aligned_form(model.module, model.params, model.params, symmetry="orthogonal")
    assert form.module is not model.module
    assert form.module.lm_head.weight is not form.module.get_input_embeddings().weight
    assert model.module.lm_head is head and head.weight is embedding.weight
    assert "lm_head.weight" not in model.params and "lm_head.weight" in form.a
