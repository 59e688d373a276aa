"""load_hf and lmckit.load compute what transformers' from_pretrained computes, for every family."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import lmckit
from lmckit.hf import example_inputs, load_hf
from lmckit.hf._files import read_hf_weights


def test_load_equals_transformers_from_pretrained(
    hf_folder, families, load_with_transformers, family: str, logits
) -> None:
    folder = hf_folder(family)
    model = load_hf(folder)
    assert model.format.class_name == families[family].model == type(model.module).__name__
    assert model.path == folder and model.config == json.loads((folder / "config.json").read_text())
    # eval mode everywhere: the fixtures' configs have dropout (GPT-2 0.1, BERT 0.1)
    assert not any(m.training for m in model.module.modules())
    inputs = example_inputs(model)
    expected = logits(load_with_transformers(family, folder), inputs)
    got = logits(model.module, inputs)
    assert (got - expected).abs().max().item() < 1e-5
    # params are the module's own weights, each tied weight once (under its first name),
    # and functional_call with them is the same function
    state = model.module.state_dict()
    assert all(model.params[k].data_ptr() == state[k].data_ptr() for k in model.params)
    omitted = state.keys() - model.params.keys()
    assert omitted == set(model.module.all_tied_weights_keys)
    ptrs = {v.data_ptr() for v in model.params.values()}
    assert all(state[k].data_ptr() in ptrs for k in omitted)
    with torch.no_grad():
        called = torch.func.functional_call(model.module, model.params, inputs).logits
    assert torch.equal(called, got)


def test_load_returns_the_loaded_module_in_eval_mode(
    hf_folder, load_with_transformers, logits
) -> None:
    folder = hf_folder("gpt2")
    module = lmckit.load(folder).module
    assert not module.training
    inputs = example_inputs(module)
    expected = logits(load_with_transformers("gpt2", folder), inputs)
    assert (logits(module, inputs) - expected).abs().max().item() < 1e-5


def test_weights_are_the_folders_not_an_initialisation(hf_folder) -> None:
    folder = hf_folder("llama")  # Llama's on-disk names are its in-memory names
    on_disk = load_file(folder / "model.safetensors")
    params = load_hf(folder).params
    assert all(torch.equal(params[k], v) for k, v in on_disk.items())


def test_cache_is_off_in_the_module_but_not_in_the_config(hf_folder) -> None:
    model = load_hf(hf_folder("llama"))
    assert model.module.config.use_cache is False  # a DynamicCache output breaks torch.export
    assert model.config["use_cache"] is True  # what the folder says, written back by save_hf


def test_dtype_option(hf_folder, logits) -> None:
    folder = hf_folder("mistral")
    wide = load_hf(folder, dtype=torch.float64)
    assert {v.dtype for v in wide.params.values() if v.is_floating_point()} == {torch.float64}
    inputs = example_inputs(wide)
    ref = logits(load_hf(folder).module, inputs)
    assert (logits(wide.module, inputs).float() - ref).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="dtype must be a floating-point dtype"):
        load_hf(folder, dtype=torch.int64)


def test_half_precision_folder_loads_as_float32_by_default(make_hf_folder, tmp_path: Path) -> None:
    make_hf_folder("llama", tmp_path / "a", dtype=torch.bfloat16)
    stored = read_hf_weights(tmp_path / "a")
    assert {v.dtype for v in stored.values()} == {torch.bfloat16}
    params = load_hf(tmp_path / "a").params
    assert all(params[k].dtype == torch.float32 for k in stored)
    assert all(torch.equal(params[k], v.float()) for k, v in stored.items())
    kept = load_hf(tmp_path / "a", dtype=None).params
    assert all(kept[k].dtype == torch.bfloat16 for k in stored)


def test_sharded_safetensors_and_pickle_weights(hf_folder, tmp_path: Path) -> None:
    folder = hf_folder("vit")  # on-disk names differ from in-memory ones in transformers 5
    state = load_file(folder / "model.safetensors")
    expected = load_hf(folder).params

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(folder / "config.json", sharded)
    names = sorted(state)
    shards = {"model-1.safetensors": names[::2], "model-2.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, sharded / shard)
    index = {"weight_map": {k: s for s, keys in shards.items() for k in keys}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(folder / "config.json", pickled)
    torch.save(state, pickled / "pytorch_model.bin")

    for root in (sharded, pickled):
        got = load_hf(root).params
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_no_architectures_uses_the_bare_auto_model(hf_folder, tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    shutil.copytree(hf_folder("llama"), folder)
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    # the LM head's weight is then unexpected: a clear error, not a silent drop
    with pytest.raises(Exception, match="unexpected lm_head.weight") as err:
        load_hf(folder)
    assert "\n" not in str(err.value)
    state = load_file(folder / "model.safetensors")
    save_file(
        {k: v for k, v in state.items() if k != "lm_head.weight"}, folder / "model.safetensors"
    )
    model = load_hf(folder)
    assert model.format.class_name == "LlamaModel"
    inputs = example_inputs(model)
    with torch.no_grad():
        got = model.module(*inputs).last_hidden_state
        expected = transformers.AutoModel.from_pretrained(folder).eval()(*inputs).last_hidden_state
    assert (got - expected).abs().max().item() < 1e-5
