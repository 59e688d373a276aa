"""Bad Hugging Face folders: each gives one clear line naming the problem, and runs no code."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import lmckit.hf._files
from lmckit.formats._checkpoint import CheckpointError
from lmckit.hf import load_hf
from lmckit.hf._files import is_hf_folder


def _copy(hf_folder, family: str, tmp_path: Path) -> Path:
    folder = tmp_path / family
    shutil.copytree(hf_folder(family), folder)
    return folder


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def _fails(folder: Path, message: str) -> str:
    with pytest.raises(CheckpointError, match=message) as err:
        load_hf(folder)
    text = str(err.value)
    assert "\n" not in text, text
    return text


def test_missing_or_corrupt_weights(hf_folder, tmp_path: Path) -> None:
    folder = _copy(hf_folder, "llama", tmp_path)
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").unlink()
    _fails(folder, "holds no weights: expected one of model.safetensors, ")
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    _fails(folder, "model.safetensors is corrupt or truncated")
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    _fails(folder, "model.safetensors is corrupt or truncated")


def test_weights_that_do_not_fit_the_config(hf_folder, tmp_path: Path) -> None:
    folder = _copy(hf_folder, "llama", tmp_path)
    state = load_file(folder / "model.safetensors")
    save_file(
        {k: v for k, v in state.items() if k != "model.norm.weight"}, folder / "model.safetensors"
    )
    _fails(
        folder, "weights do not fit a LlamaForCausalLM of this config: missing model.norm.weight"
    )
    save_file({**state, "extra.weight": torch.zeros(2)}, folder / "model.safetensors")
    _fails(folder, "unexpected extra.weight")
    save_file(state, folder / "model.safetensors")
    _edit_config(folder, intermediate_size=40)
    _fails(folder, r"weight model.layers.0.mlp.down_proj.weight has shape \(32, 37\), but")
    _edit_config(folder, intermediate_size=37)
    save_file(
        {**state, "model.norm.weight": state["model.norm.weight"] * torch.nan},
        folder / "model.safetensors",
    )
    _fails(folder, "'model.norm.weight' contains NaN")


def test_unknown_or_mismatched_architecture(hf_folder, tmp_path: Path) -> None:
    folder = _copy(hf_folder, "llama", tmp_path)
    # the config is checked before any weight is read: a corrupt file is not reached
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    for name in ("NoSuchModelForCausalLM", "AutoConfig", "__class__", "os.system"):
        _edit_config(folder, architectures=[name])
        _fails(folder, f"unknown architecture '{name}'.*custom model code is never run")
    _edit_config(folder, architectures=["GPT2LMHeadModel"])
    _fails(folder, "architecture GPT2LMHeadModel takes a GPT2Config, but model_type 'llama'")
    _edit_config(folder, architectures="LlamaForCausalLM")
    _fails(folder, "'architectures' must be a list of class names")
    _edit_config(folder, architectures=["LlamaForCausalLM"], model_type="no_such_type")
    _fails(folder, "unknown model_type 'no_such_type'")


def test_invalid_config_values(hf_folder, tmp_path: Path) -> None:
    folder = _copy(hf_folder, "llama", tmp_path)
    _edit_config(folder, num_attention_heads=5)
    _fails(
        folder, r"invalid llama config: .*hidden size \(32\) is not a multiple of .* heads \(5\)"
    )
    _edit_config(folder, num_attention_heads=4, hidden_size="big")
    _fails(folder, "invalid llama config: .*'hidden_size' expected int")


def test_bad_config_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    _fails(folder, "config.json does not exist")
    (folder / "config.json").write_text("{not json")
    _fails(folder, "config.json is not valid JSON")
    (folder / "config.json").write_text(json.dumps({"architecture": "mlp"}))
    _fails(folder, "is not a Hugging Face config: it has no 'model_type'")
    assert not is_hf_folder(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "pad": "x" * 2000}))
    assert is_hf_folder(folder)
    monkeypatch.setattr(lmckit.hf._files, "MAX_CONFIG_BYTES", 1000)
    _fails(folder, "more than the 1000 bytes allowed")
    assert not is_hf_folder(folder)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")  # reading it would block forever
    _fails(folder, "config.json is a FIFO")
    _fails(folder / "config.json", "is not a folder")


class _RunsCode:
    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def test_pickle_with_code_is_refused_and_never_run(hf_folder, tmp_path: Path) -> None:
    folder = _copy(hf_folder, "llama", tmp_path)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    sentinel = tmp_path / "ran"
    torch.save({**state, "x": _RunsCode(sentinel)}, folder / "pytorch_model.bin")
    _fails(folder, "refusing to load .*pytorch_model.bin: it is not a plain tensor state dict")
    assert not sentinel.exists()
    torch.save(state, folder / "pytorch_model.bin")  # a plain one loads
    assert load_hf(folder).format.class_name == "LlamaForCausalLM"


def test_bad_shard_index(hf_folder, tmp_path: Path) -> None:
    folder = _copy(hf_folder, "llama", tmp_path)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    save_file(state, folder / "model-1.safetensors")
    index = folder / "model.safetensors.index.json"
    outside = {k: "../model-1.safetensors" for k in state}
    index.write_text(json.dumps({"weight_map": outside}))
    _fails(folder, "names the shard '../model-1.safetensors', not a file name")
    index.write_text(json.dumps({"weight_map": {k: "model-2.safetensors" for k in state}}))
    _fails(folder, "names the shard model-2.safetensors, which is missing")
    index.write_text(
        json.dumps(
            {
                "weight_map": {
                    **{k: "model-1.safetensors" for k in state},
                    "w": "model-1.safetensors",
                }
            }
        )
    )
    _fails(folder, "model-1.safetensors lacks 'w'")
    index.write_text(json.dumps({"metadata": {}}))
    _fails(folder, "has no 'weight_map'")
