"""lmckit.load_model / save_model: one entry point for lmckit checkpoints and HF folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lmckit
from lmckit.formats._checkpoint import CheckpointError
from lmckit.formats._io import model_format
from lmckit.hf import example_inputs
from lmckit.models import create_model
from lmckit.outputs import check_output_dir
from lmckit.outputs._folders import is_lmckit_output


def test_lmckit_checkpoint_round_trip(tmp_path: Path) -> None:
    module, params = create_model("mlp", seed=0, in_features=6, hidden=[5], out_features=3)
    lmckit.save(tmp_path / "a", module, params)
    loaded = lmckit.load_model(tmp_path / "a")
    assert loaded.format.name == "lmckit" and loaded.output_kind == "checkpoint"
    assert loaded.params.keys() == params.keys()
    assert all(torch.equal(loaded.params[k], params[k]) for k in params)
    assert not loaded.module.training
    moved = {k: v + 1 for k, v in loaded.params.items()}
    out = lmckit.save_model(tmp_path / "b", loaded, moved, metadata={"did": "shift"})
    assert is_lmckit_output(out, "checkpoint")
    again = lmckit.load(out)
    assert all(torch.equal(again.params[k], moved[k]) for k in moved)
    assert lmckit.formats._checkpoint.load_metadata(out) == {"did": "shift"}
    with pytest.raises(ValueError, match="config_changes= is for Hugging Face folders"):
        lmckit.save_model(tmp_path / "c", loaded, moved, config_changes={"x": 1})


def test_hugging_face_folder_round_trip(hf_folder, load_with_transformers, tmp_path: Path) -> None:
    folder = hf_folder("mistral")
    loaded = lmckit.load_model(folder)
    assert loaded.format.name == "hf" and loaded.output_kind == "hf" and loaded.path == folder
    assert loaded.format.class_name == "MistralForCausalLM"
    inputs = example_inputs(loaded.module)
    moved = {k: v * 1.01 for k, v in loaded.params.items()}
    check_output_dir(tmp_path / "out", kind=loaded.output_kind, inputs=[folder])
    out = lmckit.save_model(tmp_path / "out", loaded, moved, metadata={"did": "scale"})
    assert is_lmckit_output(out, "hf")
    assert json.loads((out / "lmckit.json").read_text())["metadata"] == {"did": "scale"}
    with torch.no_grad():
        expected = torch.func.functional_call(loaded.module, moved, inputs).logits
        got = load_with_transformers("mistral", out)(*inputs).logits
    assert (got - expected).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="module= is for lmckit checkpoints"):
        lmckit.save_model(tmp_path / "x", loaded, moved, module=loaded.module)


def test_format_detection(hf_folder, tmp_path: Path) -> None:
    assert model_format(hf_folder("gpt2")) == "hf"
    module, params = create_model("mlp", seed=0, in_features=6, hidden=[5], out_features=3)
    assert model_format(lmckit.save(tmp_path / "ckpt", module, params)) == "lmckit"
    weights = tmp_path / "ckpt" / "model.safetensors"
    assert lmckit.load_model(weights).format.name == "lmckit"  # a weights file with its config
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(CheckpointError, match="neither an lmckit checkpoint's config"):
        lmckit.load_model(neither)


def test_dtype_reaches_both_formats(hf_folder, tmp_path: Path) -> None:
    module, params = create_model("mlp", seed=0, in_features=6, hidden=[5], out_features=3)
    lmckit.save(tmp_path / "a", module, params)
    for path in (tmp_path / "a", hf_folder("gpt2")):
        loaded = lmckit.load_model(path, dtype=torch.float64)
        floats = {v.dtype for v in loaded.params.values() if v.is_floating_point()}
        assert floats == {torch.float64}
