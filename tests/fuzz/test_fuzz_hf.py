"""Hugging Face folders checked like lmckit's own checkpoints, through the library.

Configs are checked against the weights' header before anything is allocated, A and B
are compared by config, a source folder's links out of it are never followed into an
output, and a weight that overflows on loading is named. The folders are the fuzz
world's (``tests/fuzz/conftest.py``); cases that change one copy it first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import lmckit
import lmckit.hf._files
import lmckit.hf._model
import lmckit.hf._validate
from lmckit.formats._io import check_same_architecture
from lmckit.hf import HFError, load_hf
from lmckit.symmetry._params import IncompatibleModelsError


@pytest.mark.parametrize(
    ("folder", "fragment"),
    [
        ("gpt_layers", "n_layer is 1000000, but the weights hold only 16 tensors"),
        ("gpt_vocab", "expects (20000000, 16)"),
        ("gpt_vocab_1e9", "expects (1000000000, 16)"),
    ],
)
def test_a_config_larger_than_its_weights_is_refused_at_once(
    world: Path, folder: str, fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # from the header and a shapes-only module: no weight is read and no module of what
    # the config claims is built (either would fail here, loudly)
    def allocates(*args: object, **kwargs: object) -> None:
        raise AssertionError("a weight read or a module built before the config was checked")

    monkeypatch.setattr(lmckit.hf._model, "read_hf_weights", allocates)
    monkeypatch.setattr(lmckit.hf._model, "build_module", allocates)
    with pytest.raises(HFError) as info:
        load_hf(world / "hf" / folder)
    assert fragment in str(info.value)


def test_renamed_weights_are_bounded_by_their_count(world: Path, tmp_path: Path) -> None:
    # names the module does not use (an old checkpoint's, without the prefix) cannot be
    # compared by name; the config may still not claim more parameters than are stored
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(world / "hf" / "gpt_a", tmp_path / "renamed")
    state = load_file(folder / "model.safetensors")
    save_file({k.removeprefix("transformer."): v for k, v in state.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_positions": 10**8}))
    with pytest.raises(HFError, match=r"describes a GPT2LMHeadModel of 1,600,\d+,\d+ parameters, "
                       r"but the weights hold \d+,\d+ values"):  # fmt: skip
        load_hf(folder)


def test_a_config_beyond_the_free_memory_names_both_numbers(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lmckit.hf._validate, "memory_bytes", lambda: 1000)
    with pytest.raises(HFError, match=r"needs \d+\.\d KiB \([\d,]+ parameters\), more than "
                       r"the 1000 bytes of memory available"):  # fmt: skip
        load_hf(world / "hf" / "gpt_a")


def test_a_weight_that_overflows_float32_is_named(world: Path) -> None:
    with pytest.raises(HFError, match="'transformer.h.0.mlp.c_fc.bias' overflows torch.float32"):
        load_hf(world / "hf" / "gpt_f64")
    kept = load_hf(world / "hf" / "gpt_f64", dtype=torch.float64)
    assert kept.params["transformer.h.0.mlp.c_fc.bias"][0] == 1e300


def test_folders_are_compared_by_config_not_class_name(world: Path, tmp_path: Path) -> None:
    a = lmckit.load_model(world / "hf" / "gpt_a")
    relu = lmckit.load_model(world / "hf" / "gpt_relu")
    with pytest.raises(IncompatibleModelsError, match="activation_function: 'gelu_new' vs 'relu'"):
        check_same_architecture(a, relu)
    # what does not change the function is not compared: names, dropout, token ids
    other = shutil.copytree(world / "hf" / "gpt_b", tmp_path / "b")
    config = json.loads((other / "config.json").read_text())
    changes = {"_name_or_path": "someone/else", "resid_pdrop": 0.3, "pad_token_id": 3}
    (other / "config.json").write_text(json.dumps({**config, **changes}))
    check_same_architecture(a, lmckit.load_model(other))


def test_links_out_of_the_source_folder_are_not_followed(world: Path, tmp_path: Path) -> None:
    source = lmckit.load_model(world / "hf" / "gpt_links")
    out = lmckit.save_model(tmp_path / "out", source, source.params)
    # README.md -> the secret, outside the folder: lmckit's model card only
    assert (out / "README.md").read_text().startswith("# out\n")
    assert "private key" not in "".join(
        p.read_text(errors="replace") for p in out.iterdir() if p.is_file()
    )
    # a link inside the folder is followed, and the copy is a file, not a link
    assert not (out / "tokenizer.json").is_symlink()
    assert (out / "tokenizer.json").read_bytes() == (world / "data/tok/tokenizer.json").read_bytes()
    marker = json.loads((out / "lmckit.json").read_text())
    assert marker["not_copied"] == {"README.md": "a symbolic link to a file outside the folder"}


def test_hub_cache_links_into_blobs_are_followed(world: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models--me--gpt"
    snapshot = repo / "snapshots" / "abc123"
    shutil.copytree(world / "hf" / "gpt_a", snapshot)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "f00d").write_text("a model card")
    (snapshot / "README.md").symlink_to("../../blobs/f00d")
    source = lmckit.load_model(snapshot)
    out = lmckit.save_model(tmp_path / "out", source, source.params)
    # the source's card, kept below lmckit's
    assert (out / "README.md").read_text().endswith("## The source's model card\n\na model card\n")


def test_extra_files_are_size_capped(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = shutil.copytree(world / "hf" / "gpt_a", tmp_path / "src")
    (folder / "notes.txt").write_bytes(b"x" * 2000)
    (folder / "small.txt").write_bytes(b"y" * 10)
    monkeypatch.setattr(lmckit.hf._files, "MAX_EXTRA_BYTES", 1000)
    source = lmckit.load_model(folder)
    out = lmckit.save_model(tmp_path / "out", source, source.params)
    assert (out / "small.txt").exists() and not (out / "notes.txt").exists()
    marker = json.loads((out / "lmckit.json").read_text())
    assert marker["not_copied"] == {
        "notes.txt": "2,000 bytes, over the 1,000-byte limit for copied files"
    }


def test_float64_folder_with_finite_values_still_loads(world: Path) -> None:
    loaded = load_hf(world / "hf" / "gpt_a", dtype=torch.float64)
    assert all(v.dtype == torch.float64 for v in loaded.params.values())
