"""save_hf writes folders transformers loads with the given params' function, and nothing else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lmckit.hf import HFError, example_inputs, load_hf, save_hf
from lmckit.hf._layout import stored_layout
from lmckit.outputs import OutputError, check_output_dir
from lmckit.outputs._folders import is_lmckit_output


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _permute_ffn(params, ffn, seed: int = 0) -> dict[str, torch.Tensor]:
    """Layer 0's FFN units permuted: weights change, the function does not."""
    n = params[ffn[0][0]].shape[ffn[0][1]]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    out = dict(params)
    for name, axis in ffn:
        out[name] = params[name].index_select(axis, perm)
    return out


def _disk_keys(folder: Path) -> set[str]:
    with safe_open(folder / "model.safetensors", "pt") as fh:
        return set(fh.keys())


def test_permuted_ffn_round_trip(
    hf_folder, families, load_with_transformers, tmp_path: Path, family: str, logits
) -> None:
    model = load_hf(hf_folder(family))
    inputs = example_inputs(model)
    ffn = families[family].ffn
    permuted = _permute_ffn(model.params, ffn)
    expected = logits(model.module, inputs, permuted)
    assert _max_diff(expected, logits(model.module, inputs)) < 1e-5  # a true symmetry
    out = save_hf(tmp_path / "out", model, permuted, metadata={"did": "permute"})
    loaded = load_with_transformers(family, out)
    assert type(loaded).__name__ == model.format.class_name
    assert _max_diff(logits(loaded, inputs), expected) < 1e-5
    # the permuted weights were written, not the originals
    state = loaded.state_dict()
    for name, _axis in ffn:
        assert torch.equal(state[name], permuted[name])
        assert not torch.equal(state[name], model.params[name])


def test_any_params_keep_their_function(
    hf_folder, load_with_transformers, tmp_path: Path, family: str, logits
) -> None:
    model = load_hf(hf_folder(family))
    inputs = example_inputs(model)
    gen = torch.Generator().manual_seed(1)
    moved = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
        for k, v in model.params.items()
    }
    expected = logits(model.module, inputs, moved)
    assert _max_diff(expected, logits(model.module, inputs)) > 1e-2  # a different function
    before = {k: v.clone() for k, v in moved.items()}
    out = save_hf(tmp_path / "out", model, moved)
    assert _max_diff(logits(load_with_transformers(family, out), inputs), expected) < 1e-5
    assert all(torch.equal(moved[k], before[k]) for k in before)  # inputs untouched


def test_tied_weights_are_written_once_while_equal(hf_folder, tmp_path: Path) -> None:
    model = load_hf(hf_folder("gpt2"))
    assert "lm_head.weight" not in model.params  # tied: once, under the embeddings' name
    for params in (
        model.params,
        {**model.params, "lm_head.weight": model.params["transformer.wte.weight"]},
    ):
        out = save_hf(tmp_path / "out", model, params)
        assert "lm_head.weight" not in _disk_keys(out)
        assert json.loads((out / "config.json").read_text()).get("tie_word_embeddings", True)
        assert json.loads((out / "lmckit.json").read_text())["untied"] == []


def test_a_head_that_differs_from_the_embeddings_is_untied(
    make_hf_folder, load_with_transformers, tmp_path: Path, logits
) -> None:
    # Folding the final RMSNorm's weight into a tied LM head keeps the function but makes
    # the head differ from the embeddings: the written config must untie them.
    source = make_hf_folder("llama", tmp_path / "tied", tie_word_embeddings=True)
    model = load_hf(source)
    assert "lm_head.weight" not in model.params
    embed, norm = model.params["model.embed_tokens.weight"], model.params["model.norm.weight"]
    folded = {
        **model.params,
        "lm_head.weight": embed * norm[None, :],
        "model.norm.weight": torch.ones_like(norm),
    }
    inputs = example_inputs(model)
    out = save_hf(tmp_path / "out", model, folded)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    marker = json.loads((out / "lmckit.json").read_text())
    assert marker["untied"] == [["lm_head.weight", "model.embed_tokens.weight"]]
    assert marker["config_changes"] == {"tie_word_embeddings": False}
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= _disk_keys(out)
    loaded = load_with_transformers("llama", out)
    assert torch.equal(loaded.state_dict()["model.embed_tokens.weight"], embed)
    assert _max_diff(logits(loaded, inputs), logits(model.module, inputs)) < 1e-5
    # and it loads back into lmckit untied, with the same function
    again = load_hf(out)
    assert torch.equal(again.params["lm_head.weight"], folded["lm_head.weight"])


def test_files_config_changes_and_marker(hf_folder, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(hf_folder("llama"), source)
    (source / "tokenizer.json").write_text('{"model": {"vocab": {}}}')
    (source / "tokenizer_config.json").write_text('{"model_max_length": 16}')
    generation = json.loads((source / "generation_config.json").read_text())
    (source / "generation_config.json").write_text(json.dumps({**generation, "max_length": 7}))
    (source / "tf_model.h5").write_bytes(b"stale weights")  # never copied: old values
    (source / ".hidden").write_text("x")
    (source / "runs").mkdir()
    model = load_hf(source)
    out = save_hf(
        tmp_path / "out",
        model,
        model.params,
        config_changes={"rms_norm_eps": 1e-3},
        metadata={"command": "align", "inputs": ["a", "b"]},
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "README.md",  # the model card lmckit writes
        "config.json",
        "generation_config.json",
        "lmckit.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    config = json.loads((out / "config.json").read_text())
    assert config["rms_norm_eps"] == 1e-3 and config["use_cache"] is True
    assert config["architectures"] == ["LlamaForCausalLM"]
    marker = json.loads((out / "lmckit.json").read_text())
    assert marker["files"] == names and marker["source"] == str(source)
    assert marker["metadata"] == {"command": "align", "inputs": ["a", "b"]}
    assert marker["config_changes"] == {"rms_norm_eps": 1e-3} and marker["format"] == "hf"
    mode = (out / "config.json").stat().st_mode & 0o777
    assert (out / "model.safetensors").stat().st_mode & 0o777 == mode


def test_written_folder_is_an_lmckit_output_of_kind_hf(hf_folder, tmp_path: Path) -> None:
    source = hf_folder("bert")
    model = load_hf(source)
    out = save_hf(tmp_path / "out", model, model.params)
    assert is_lmckit_output(out, "hf")
    assert not is_lmckit_output(out, "checkpoint")
    assert not is_lmckit_output(source, "hf")  # a folder lmckit did not write
    check_output_dir(out, kind="hf")
    save_hf(out, model, model.params)  # replaced as a whole
    (out / "notes.txt").write_text("mine")
    assert not is_lmckit_output(out, "hf")
    with pytest.raises(OutputError, match="it is not a Hugging Face folder lmckit wrote"):
        check_output_dir(out, kind="hf")


def test_on_disk_names_are_accepted(
    hf_folder, load_with_transformers, tmp_path: Path, logits
) -> None:
    folder = hf_folder("vit")  # transformers 5 renames ViT's weights when loading
    model = load_hf(folder)
    disk = {k: v + 0.01 for k, v in load_file(folder / "model.safetensors").items()}
    assert disk.keys() != model.params.keys()
    out = save_hf(tmp_path / "out", model, disk)
    # what transformers itself makes of these on-disk names
    reference = type(model.module).from_pretrained(
        None, config=model.module.config, state_dict=disk
    )
    inputs = example_inputs(model)
    expected = logits(reference.eval(), inputs)
    assert _max_diff(expected, logits(model.module, inputs)) > 1e-3
    assert _max_diff(logits(load_with_transformers("vit", out), inputs), expected) < 1e-5


def test_the_source_folder_is_never_written(hf_folder, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(hf_folder("gpt2"), source)
    model = load_hf(source)
    before = _listing(source)
    for target in (source, source / "sub", tmp_path):
        with pytest.raises(OutputError, match="input"):
            save_hf(target, model, model.params, overwrite=True)
    assert _listing(source) == before


def _listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_bad_params_write_nothing(hf_folder, tmp_path: Path) -> None:
    model = load_hf(hf_folder("llama"))
    params = model.params
    key = "model.layers.0.mlp.up_proj.weight"
    bad = {
        "missing model.norm.weight": {k: v for k, v in params.items() if k != "model.norm.weight"},
        "unexpected extra.weight": {**params, "extra.weight": torch.zeros(2)},
        f"{key} has shape \\(36, 32\\)": {**params, key: params[key][:-1]},
        "contains NaN": {**params, key: torch.full_like(params[key], float("nan"))},
        "params must map names to tensors": {**params, key: 3.0},
    }
    existing = save_hf(tmp_path / "out", model, params)
    # params of several floating dtypes are all stored in the folder's own
    mixed = save_hf(tmp_path / "mixed", model, {**params, key: params[key].double()})
    assert stored_layout(mixed).dtype == stored_layout(existing).dtype == torch.float32
    shutil.rmtree(mixed)
    before = _listing(tmp_path)
    for message, wrong in bad.items():
        for target in (tmp_path / "new", existing):
            with pytest.raises(HFError, match=message) as err:
                save_hf(target, model, wrong)
            assert "\n" not in str(err.value)
    with pytest.raises(HFError, match="not JSON"):
        save_hf(tmp_path / "new", model, params, metadata={"t": torch.zeros(1)})
    assert _listing(tmp_path) == before  # no new folder, no leftovers, the old one intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
