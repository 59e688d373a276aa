"""Tiny random Hugging Face folders (2 layers, width 32) built from configs; nothing is downloaded.

:func:`build_hf_folder` writes one with ``save_pretrained``; the session fixture
``hf_folder`` builds each family once and hands out its path (tests must not modify
it: copy it first). Every weight is moved by 0.1 N(0, 1) after initialisation, so norms
and biases are not the trivial 1 and 0 and every weight matters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

transformers.utils.logging.disable_progress_bar()


@dataclass(frozen=True)
class Family:
    """One ``transformers`` family and how the tests treat it."""

    config: str  # config class
    model: str  # model class (config.json's architectures[0])
    auto: str  # the Auto class that loads the folder
    kwargs: dict[str, Any]
    #: FFN units of layer 0: (parameter, axis) pairs that one permutation of the units moves
    ffn: tuple[tuple[str, int], ...] = field(default=())


_TEXT = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, intermediate_size=37)
_DECODER = dict(_TEXT, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
_GATED = (
    ("model.layers.0.mlp.gate_proj.weight", 0),
    ("model.layers.0.mlp.up_proj.weight", 0),
    ("model.layers.0.mlp.down_proj.weight", 1),
)

FAMILIES: dict[str, Family] = {
    "gpt2": Family(
        "GPT2Config",
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        # bos/eos inside the tiny vocabulary (the defaults, 50256, are not)
        dict(vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=2, n_inner=37)
        | dict(bos_token_id=0, eos_token_id=0),
        (
            ("transformer.h.0.mlp.c_fc.weight", 1),  # Conv1D: (in, out)
            ("transformer.h.0.mlp.c_fc.bias", 0),
            ("transformer.h.0.mlp.c_proj.weight", 0),
        ),
    ),
    "bert": Family(
        "BertConfig",
        "BertForMaskedLM",
        "AutoModelForMaskedLM",
        dict(_TEXT, num_attention_heads=4, max_position_embeddings=16),
        (
            ("bert.encoder.layer.0.intermediate.dense.weight", 0),
            ("bert.encoder.layer.0.intermediate.dense.bias", 0),
            ("bert.encoder.layer.0.output.dense.weight", 1),
        ),
    ),
    "vit": Family(
        "ViTConfig",
        "ViTForImageClassification",
        "AutoModelForImageClassification",
        dict(
            image_size=8,
            patch_size=4,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            num_labels=3,
        ),
        (
            ("vit.layers.0.mlp.fc1.weight", 0),
            ("vit.layers.0.mlp.fc1.bias", 0),
            ("vit.layers.0.mlp.fc2.weight", 1),
        ),
    ),
    # grouped-query attention: 4 query heads share 2 key/value heads
    "llama": Family("LlamaConfig", "LlamaForCausalLM", "AutoModelForCausalLM", _DECODER, _GATED),
    "mistral": Family(
        "MistralConfig", "MistralForCausalLM", "AutoModelForCausalLM", _DECODER, _GATED
    ),
}


def build_hf_folder(
    family: str,
    path: Path,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **overrides: Any,
) -> Path:
    """Write a tiny random ``family`` model to ``path`` (``save_pretrained``); return ``path``."""
    fam = FAMILIES[family]
    config = getattr(transformers, fam.config)(**{**fam.kwargs, **overrides})
    with torch.random.fork_rng(devices=[]):  # transformers initialises from the global RNG
        torch.manual_seed(seed)
        model = getattr(transformers, fam.model)(config).eval()
        with torch.no_grad():
            for p in model.parameters():  # tied weights are one parameter: they stay tied
                p.add_(0.1 * torch.randn_like(p))
    model.to(dtype).save_pretrained(path)
    return path


def auto_load(family: str, path: Path) -> torch.nn.Module:
    """``AutoModel*.from_pretrained(path)``: what a ``transformers`` user gets from the folder."""
    return getattr(transformers, FAMILIES[family].auto).from_pretrained(path).eval()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # A test taking ``family`` runs once per family.
    if "family" in metafunc.fixturenames:
        metafunc.parametrize("family", sorted(FAMILIES))


@pytest.fixture(scope="session")
def families() -> dict[str, Family]:
    return FAMILIES


@pytest.fixture(scope="session")
def make_hf_folder() -> Callable[..., Path]:
    """:func:`build_hf_folder`: ``make_hf_folder(family, path, seed=, dtype=, **config)``."""
    return build_hf_folder


@pytest.fixture(scope="session")
def load_with_transformers() -> Callable[[str, Path], torch.nn.Module]:
    """:func:`auto_load`: ``load_with_transformers(family, path)``."""
    return auto_load


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``hf_folder(family)``: a tiny folder of that family, built once per session (read only)."""
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_hf_folder(family, tmp_path_factory.mktemp(f"hf-{family}"))
        return built[family]

    return get


def first_output(module: torch.nn.Module, inputs: Any, params: Any = None) -> torch.Tensor:
    """The module's first output (logits, or the last hidden state of a bare model) on
    ``inputs`` (a tensor or a tuple of them), with ``params`` if given; no gradients."""
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    with torch.no_grad():
        out = module(*args) if params is None else torch.func.functional_call(module, params, args)
    return out[0]


@pytest.fixture(scope="session")
def logits() -> Callable[..., torch.Tensor]:
    """:func:`first_output`: ``logits(module, inputs, params=None)``."""
    return first_output
