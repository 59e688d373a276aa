"""Zoo conversions: local Hugging Face GPT-2 / ViT folders -> zoo models with the same logits.

(The general Hugging Face path, any ``transformers`` model as itself, is tested in ``tests/hf``.)

The comparisons against ``transformers`` build tiny random models locally (nothing is
downloaded) and skip when ``transformers`` is not installed; the file-format tests write
checkpoints by hand and need only ``safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tests.tiny_models import auto_load, build_hf_folder

from lmckit.hf import HFError, zoo_from_hf
from lmckit.hf._files import read_hf_weights
from lmckit.hf._zoo import zoo_model_kwargs
from lmckit.models import create_model

GPT2_SIZES = dict(vocab_size=61, n_positions=12, n_embd=16, n_layer=2, n_head=2, n_inner=24)
VIT_SIZES = dict(
    image_size=8,
    patch_size=4,
    num_channels=2,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=20,
    num_labels=3,
)


def _hf_gpt2(tmp_path: Path, **overrides: object) -> torch.nn.Module:
    pytest.importorskip("transformers")
    build_hf_folder("gpt2", tmp_path, **{**GPT2_SIZES, **overrides})
    return auto_load("gpt2", tmp_path)


def _hf_vit(tmp_path: Path, **overrides: object) -> torch.nn.Module:
    pytest.importorskip("transformers")
    build_hf_folder("vit", tmp_path, **{**VIT_SIZES, **overrides})
    return auto_load("vit", tmp_path)


def _tokens(vocab: int, t: int) -> torch.Tensor:
    return torch.randint(0, vocab, (3, t), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_logits_match_transformers(tmp_path: Path, tied: bool) -> None:
    hf = _hf_gpt2(tmp_path, tie_word_embeddings=tied)
    module, params = zoo_from_hf(tmp_path)
    assert module.config.name == "gpt2" and module.tie_embeddings is tied
    assert ("lm_head.weight" in params) is not tied
    x = _tokens(61, 12)
    with torch.no_grad():
        expected = hf(x).logits
        got = module(x)  # the module itself holds the weights and is in eval mode
    assert not any(m.training for m in module.modules())
    assert got.shape == (3, 12, 61)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(
        torch.func.functional_call(module, params, (x,)), expected, atol=1e-4, rtol=0
    )


def test_vit_logits_match_transformers(tmp_path: Path) -> None:
    hf = _hf_vit(tmp_path)
    module, params = zoo_from_hf(tmp_path)
    assert module.config.name == "vit" and module.config.kwargs["num_classes"] == 3
    x = torch.randn(4, 2, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(x).logits
        got = module(x)
    assert not module.training
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_vit_without_qkv_bias_and_in_memory_names(tmp_path: Path) -> None:
    hf = _hf_vit(tmp_path, qkv_bias=False)
    # A bare state dict of transformers >= 5 uses its in-memory names; read it as .bin.
    (tmp_path / "model.safetensors").unlink()
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    module, params = zoo_from_hf(tmp_path)
    assert float(params["vit.encoder.layer.0.attention.attention.query.bias"].abs().sum()) == 0
    x = torch.randn(2, 2, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf(x).logits
    torch.testing.assert_close(
        torch.func.functional_call(module, params, (x,)), expected, atol=1e-4, rtol=0
    )


def _write_hf_gpt2(root: Path, *, prefix: str, dtype: torch.dtype) -> tuple[object, dict]:
    """A hand-written HF-format GPT-2 checkpoint of a zoo model (Conv1D layout)."""
    module, params = create_model(
        "gpt2", seed=4, vocab_size=40, n_layer=2, n_head=2, n_embd=8, n_inner=12, context=6
    )
    state = {}
    for name, value in params.items():
        if name.startswith("transformer.h.") and value.ndim == 2:
            value = value.T  # Linear (out, in) -> Conv1D (in, out)
        state[name.removeprefix(prefix)] = value.to(dtype).contiguous()
    # old checkpoints carry the causal mask as a buffer
    state["transformer.h.0.attn.bias".removeprefix(prefix)] = torch.ones(1, 1, 6, 6)
    root.mkdir(parents=True, exist_ok=True)
    save_file(state, root / "model.safetensors")
    config = {
        "model_type": "gpt2",
        "vocab_size": 40,
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 8,
        "n_inner": 12,
        "n_positions": 6,
        "resid_pdrop": 0.0,
    }
    (root / "config.json").write_text(json.dumps(config))
    return module, params


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_gpt2_from_files_alone(tmp_path: Path, prefix: str) -> None:
    # OpenAI's original checkpoints name weights without "transformer."; both must load.
    module, params = _write_hf_gpt2(tmp_path, prefix=prefix, dtype=torch.float16)
    _, loaded = zoo_from_hf(tmp_path)
    assert loaded.keys() == params.keys()
    for name, value in params.items():
        assert loaded[name].dtype == torch.float32
        torch.testing.assert_close(loaded[name], value.half().float(), atol=0, rtol=0)
    assert zoo_model_kwargs(json.loads((tmp_path / "config.json").read_text()))[0] == "gpt2"


def test_sharded_safetensors(tmp_path: Path) -> None:
    _, params = _write_hf_gpt2(tmp_path / "one", prefix="", dtype=torch.float32)
    state = read_hf_weights(tmp_path / "one")
    names = sorted(state)
    shards = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    root = tmp_path / "sharded"
    root.mkdir()
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, root / shard)
    index = {"weight_map": {k: s for s, keys in shards.items() for k in keys}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
    _, loaded = zoo_from_hf(root)
    assert all(torch.equal(loaded[k], params[k]) for k in params)


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(HFError, match="config.json does not exist"):
        zoo_from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(HFError, match="unsupported model_type 'bert'.*GPT2LMHeadModel"):
        zoo_from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(HFError, match="holds no weights"):
        zoo_from_hf(tmp_path)
    with pytest.raises(HFError, match="activation_function='relu'"):
        zoo_model_kwargs({"model_type": "gpt2", "activation_function": "relu"})
    _write_hf_gpt2(tmp_path, prefix="", dtype=torch.float32)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_inner": 16}))
    with pytest.raises(HFError, match="mlp.c_fc.weight has shape"):
        zoo_from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layer": 3}))
    with pytest.raises(HFError, match=r"missing \['transformer.h.2"):
        zoo_from_hf(tmp_path)
