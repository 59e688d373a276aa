"""The lmckit side of ``benchmarks/reference_comparison.py`` on tiny random GPT-2 folders.

The reference code itself needs its own environment and is not run here; its layout is
checked by the benchmark on every run (logits of its merged model).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from lmckit.data import Dataset
from lmckit.hf import load_hf, save_hf
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import apply

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def harness():
    path = ROOT / "benchmarks" / "reference_comparison.py"
    spec = importlib.util.spec_from_file_location("reference_comparison", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _tokens(vocab: int, context: int, seed: int = 0) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(1, vocab, (24, context), generator=gen)  # token 0 never occurs
    y = torch.roll(x, -1, 1)
    return Dataset("tokens", x[:16], y[:16], x[16:], y[16:], num_classes=vocab)


@pytest.fixture(scope="module")
def permuted_pair(tmp_path_factory, make_hf_folder):
    """A tiny GPT-2 folder and a copy with planted residual, head and unit permutations."""
    root = tmp_path_factory.mktemp("cmp")
    a = make_hf_folder("gpt2", root / "a", seed=0)
    model = load_hf(a)
    x = torch.randint(0, 61, (2, 16))
    spec = analyze_symmetries(model.module, (x,)).spec
    moved = apply(spec, model.params, random_transform(spec, seed=7))
    b = save_hf(root / "b", model, moved)
    return a, b


def test_folding_the_kept_norm_biases_gives_lmckit_form(harness, permuted_pair) -> None:
    pair = harness.load_pair(*permuted_pair)
    layers = pair.circuits.n_layer
    for bare, betas, folded in (
        (pair.bare_a, pair.betas_a, pair.a),
        (pair.bare_b, pair.betas_b, pair.b),
    ):
        out = harness.fold(bare, betas, layers)
        for k in folded:
            torch.testing.assert_close(out[k], folded[k], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("permutations_only", [True, False])
def test_lmckit_side_recovers_planted_permutations(
    harness, permuted_pair, permutations_only
) -> None:
    pair = harness.load_pair(*permuted_pair)
    data = _tokens(61, 16)
    spec, transform, _ = harness.lmckit_align(pair, data, permutations_only=permutations_only)
    bare_b, betas_b = harness.moved(pair, spec, transform)
    for k in pair.bare_a:
        torch.testing.assert_close(bare_b[k], pair.bare_a[k], atol=1e-4, rtol=1e-4)
    for k in pair.betas_a:
        torch.testing.assert_close(betas_b[k], pair.betas_a[k], atol=1e-4, rtol=1e-4)
    barriers = harness.barrier_paths(pair, data, bare_b, betas_b)
    assert barriers["paper_path"] == pytest.approx(0.0, abs=1e-4)
    assert barriers["lmckit_path"] == pytest.approx(0.0, abs=1e-4)


def test_lmckit_side_recovers_a_planted_rotation(harness, permuted_pair) -> None:
    """B = A with its circuit form rotated (residual), heads and units permuted."""
    pair = harness.load_pair(permuted_pair[0], permuted_pair[0])
    planted = random_transform(pair.spec, seed=11)
    rotation = pair.spec["residual"].group.matrix(planted["residual"]).float()
    pair = dataclasses.replace(
        pair,
        b=apply(pair.spec, pair.a, planted),
        bare_b=apply(pair.spec, pair.bare_a, planted),
        betas_b={k: rotation @ v for k, v in pair.betas_a.items()},
    )
    data = _tokens(61, 16, seed=1)
    spec, transform, _ = harness.lmckit_align(pair, data)
    bare_b, betas_b = harness.moved(pair, spec, transform)
    for k in pair.bare_a:
        torch.testing.assert_close(bare_b[k], pair.bare_a[k], atol=1e-4, rtol=1e-4)
    for k in pair.betas_a:
        torch.testing.assert_close(betas_b[k], pair.betas_a[k], atol=1e-4, rtol=1e-4)
