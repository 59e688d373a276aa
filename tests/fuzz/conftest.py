"""A hostile little world for the fuzz suite: good and broken checkpoints, data, folders.

Built once per session in a temporary folder. Cases may write only to fresh paths
under ``outs/``; everything else must stay byte-for-byte as built (checked by
:func:`snapshot` before and after every case).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import lmckit
from lmckit.models import create_model

#: The word-level tokenizer's vocabulary (9 tokens).
WORDS = ["<unk>", "the", "cat", "sat", "on", "mat", "and", "dog", "ran"]


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root``: bytes of regular files, targets of links, kinds of the rest.

    Never opens a FIFO or a device (reading them would hang or never end).
    """
    out: dict[str, object] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_fifo():
                out[rel] = "fifo"
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return out


def _mlp(path: Path, seed: int, hidden: list[int], *, inputs: int = 64, classes: int = 10) -> Path:
    model, params = create_model(
        "mlp", seed=seed, in_features=inputs, hidden=hidden, out_features=classes
    )
    lmckit.save(path, model, params)
    return path


def _variant(src: Path, dst: Path, *, params=None, config=None) -> Path:
    """A copy of checkpoint ``src`` with its tensors or config.json replaced."""
    dst.mkdir(parents=True)
    doc = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config if config is not None else doc))
    if params is None:
        shutil.copy(src / "model.safetensors", dst / "model.safetensors")
    else:
        save_file(params, str(dst / "model.safetensors"))
    return dst


def _idx(path: Path, shape: tuple[int, ...], payload: bytes) -> None:
    header = bytes([0, 0, 0x08, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape)
    path.write_bytes(gzip.compress(header + payload, compresslevel=1))


def _tokenizer(folder: Path) -> Path:
    import tokenizers

    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _gpt2(path: Path, vocab: int, seed: int = 0) -> Path:
    model, params = create_model(
        "gpt2", seed=seed, vocab_size=vocab, n_layer=1, n_head=2, n_embd=8, context=8
    )
    lmckit.save(path, model, params)
    return path


def _hf(path: Path, family: str, seed: int, **overrides: object) -> Path:
    """A tiny random Hugging Face folder (``save_pretrained``) of the 9-word vocabulary."""
    import transformers

    if family == "gpt2":
        sizes = dict(vocab_size=len(WORDS), n_positions=16, n_embd=16, n_layer=1, n_head=2,
                     bos_token_id=0, eos_token_id=0)  # fmt: skip
        config = transformers.GPT2Config(**{**sizes, **overrides})
        cls = transformers.GPT2LMHeadModel
    else:
        sizes = dict(
            vocab_size=len(WORDS),
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=24,
            max_position_embeddings=16,
        )
        config = transformers.BertConfig(**{**sizes, **overrides})
        cls = transformers.BertForMaskedLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cls(config).eval().save_pretrained(path)
    return path


def _hf_config(src: Path, dst: Path, **changes: object) -> Path:
    """A copy of the Hugging Face folder ``src`` with entries of its config.json changed."""
    shutil.copytree(src, dst)
    doc = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**doc, **changes}))
    return dst


def _hf_world(root: Path) -> None:
    hf = root / "hf"
    gpt = _hf(hf / "gpt_a", "gpt2", 0)
    _hf(hf / "gpt_b", "gpt2", 1)
    # same class and shapes as gpt_a, another function
    _hf(hf / "gpt_relu", "gpt2", 1, activation_function="relu", n_head=4)
    _hf_config(gpt, hf / "gpt_layers", n_layer=1_000_000)
    _hf_config(gpt, hf / "gpt_vocab", vocab_size=20_000_000)
    _hf_config(gpt, hf / "gpt_vocab_1e9", vocab_size=10**9)
    _hf(hf / "bert", "bert", 0)
    # a model card that links to a file outside the folder, a tokenizer inside it
    linked = shutil.copytree(gpt, hf / "gpt_links")
    (root / "secret.txt").write_text("private key")
    (linked / "README.md").symlink_to(root / "secret.txt")
    shutil.copy(root / "data" / "tok" / "tokenizer.json", linked / "tok.json")
    (linked / "tokenizer.json").symlink_to("tok.json")
    # float64 weights, one beyond float32's range
    big = shutil.copytree(gpt, hf / "gpt_f64")
    state = {k: v.double() for k, v in load_file(big / "model.safetensors").items()}
    state["transformer.h.0.mlp.c_fc.bias"][0] = 1e300
    save_file(state, str(big / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("world")
    ck = root / "ckpt"
    a, b = _mlp(ck / "a", 0, [16]), _mlp(ck / "b", 1, [16])
    _mlp(ck / "c", 2, [16])
    _mlp(ck / "mnist_mlp", 0, [8], inputs=784)
    _mlp(ck / "five", 0, [16], classes=5)
    pa = lmckit.load(a).params
    _variant(a, ck / "half", params={k: v.half() for k, v in pa.items()})
    _variant(b, ck / "bf16", params={k: v.bfloat16() for k, v in lmckit.load(b).params.items()})
    _variant(a, ck / "int32", params={**pa, "layers.0.weight": pa["layers.0.weight"].int()})
    _variant(a, ck / "bool", params={**pa, "head.bias": pa["head.bias"] > 0})
    doc = json.loads((a / "config.json").read_text())
    for name, hidden in (("big_config", [50000, 50000]), ("neg_config", [-5]),
                         ("huge_config", [10**30]), ("quoted_config", "16")):  # fmt: skip
        _variant(a, ck / name, config={**doc, "kwargs": {**doc["kwargs"], "hidden": hidden}})
    gdoc = json.loads((_gpt2(ck / "gpt_src", 9) / "config.json").read_text())
    _variant(ck / "gpt_src", ck / "gpt_layers",
             config={**gdoc, "kwargs": {**gdoc["kwargs"], "n_layer": 10**12}})  # fmt: skip
    nested = _variant(a, ck / "nested")
    (nested / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    hugeint = _variant(a, ck / "hugeint")
    (hugeint / "config.json").write_text('{"architecture": "mlp", "kwargs": {"in_features": '
                                         + "9" * 5000 + "}}")  # fmt: skip
    devzero = _variant(a, ck / "devzero")
    (devzero / "config.json").unlink()
    (devzero / "config.json").symlink_to("/dev/zero")
    fifo = _variant(a, ck / "fifo")
    (fifo / "config.json").unlink()
    os.mkfifo(fifo / "config.json")
    trunc = _variant(a, ck / "trunc")
    weights = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    # data
    data = root / "data"
    bomb = data / "mnist_bomb"
    bomb.mkdir(parents=True)
    # a 1 KB gzip whose header declares 10 million images (7.8 GB)
    _idx(bomb / "t10k-images-idx3-ubyte.gz", (10_000_000, 28, 28), bytes(784))
    _idx(bomb / "t10k-labels-idx1-ubyte.gz", (10_000_000,), bytes(10))
    trail = data / "mnist_trail"
    trail.mkdir()
    # declares 10 images, expands to 64 MB: decompression must stop just past 10
    _idx(trail / "t10k-images-idx3-ubyte.gz", (10, 28, 28), bytes(64 << 20))
    _idx(trail / "t10k-labels-idx1-ubyte.gz", (10,), bytes(10))
    tok = _tokenizer(data / "tok")
    bad_tok = data / "bad_tok"
    bad_tok.mkdir()
    (bad_tok / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"')
    words = [WORDS[1 + (i * 7 + i // 5) % 8] for i in range(3000)]
    (data / "corpus.txt").write_text(" ".join(words))
    assert tok.is_dir()
    _gpt2(ck / "gpt_small", 5)
    _gpt2(ck / "gpt_big", 20)
    _gpt2(ck / "gpt_ok", len(WORDS), 0)
    _gpt2(ck / "gpt_ok2", len(WORDS), 1)
    # an lmckit checkpoint whose reference/ holds a user's file
    with_ref = _mlp(ck / "with_ref", 0, [16])
    (with_ref / "reference").mkdir()
    (with_ref / "reference" / "mydata.txt").write_text("mine")
    # a user's folder and a working directory full of their files
    for folder in (root / "user", root / "work"):
        folder.mkdir()
        (folder / "notes.txt").write_text("mine")
        (folder / "sub").mkdir()
        (folder / "sub" / "data.bin").write_bytes(b"\x00\x01")
    # an lmckit checkpoint stored in float64 with one weight beyond float32's range
    _variant(a, ck / "overflow",
             params={**{k: v.double() for k, v in pa.items()},
                     "head.bias": torch.full((10,), 1e300, dtype=torch.float64)})  # fmt: skip
    _hf_world(root)
    (root / "outs").mkdir()
    return root


@pytest.fixture(scope="session")
def snap():
    """:func:`snapshot`, for the test modules (conftest is not importable by name)."""
    return snapshot
