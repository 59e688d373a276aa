"""Fixtures of tiny random Hugging Face folders (:mod:`tests.tiny_models`).

The session fixture ``hf_folder`` builds each family once and hands out its path (tests
must not modify it: copy it first); a test taking ``family`` runs once per family.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from tests.tiny_models import FAMILIES, Family, auto_load, build_hf_folder

transformers.utils.logging.disable_progress_bar()


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
