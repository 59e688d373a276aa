"""The two Llama models ``lmckit reproduce llama-shakespeare`` trained, in the orthogonal
form (RMSNorm scales folded, the residual stream orthogonal): what the scripts that study
that pair start from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from lmckit.experiments._datasets import char_dataset
from lmckit.experiments._llama_shakespeare import LlamaShakespeareConfig, _build
from lmckit.forms._recipe import AlignForm, aligned_form

TEXT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tinyshakespeare"


@dataclass(frozen=True)
class TrainedPair:
    config: LlamaShakespeareConfig
    data: Any  # the character dataset the pair was trained on
    module: Any  # the transformers model the parameters belong to
    form: AlignForm


def load_pair(run: Path, text: Path = TEXT / "input.txt") -> TrainedPair:
    """The pair of run folder ``run`` (``runs/llama-shakespeare/full-<hash>``)."""
    config = LlamaShakespeareConfig()
    data = char_dataset(text, chars=config.chars, block=config.block)
    module, _ = _build(config, data.num_classes, 0)
    names = dict(module.named_parameters())
    folders = [run / "models" / f"llama-seed{seed}" for seed in (0, 1)]
    a, b = (
        {k: v for k, v in load_file(f / "model.safetensors").items() if k in names} for f in folders
    )
    return TrainedPair(config, data, module, aligned_form(module, a, b, symmetry="orthogonal"))
