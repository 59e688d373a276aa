"""A space the function refuses is left out and reported, not the whole spec: BLOOM's
attention heads carry per-head ALiBi slopes, so their order is fixed (read off the graph);
the bases inside each head, the residual stream and the MLP units are still aligned."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import lmckit
from lmckit.cli import main
from lmckit.inference import analyze_symmetries

transformers = pytest.importorskip("transformers")


def _bloom(seed: int) -> torch.nn.Module:
    config = transformers.BloomConfig(
        vocab_size=61, hidden_size=32, n_layer=2, n_head=4, use_cache=False
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.BloomForCausalLM(config).eval()


def test_heads_fixed_by_alibi_are_left_out_with_the_reason() -> None:
    model = _bloom(0)
    x = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(0))
    analysis = analyze_symmetries(model, (x,))
    names = analysis.spec.names
    assert "residual" in names and sum("mlp" in n for n in names) == 2
    # no head permutation: the graph says the slopes fix the order (not only the check)
    assert not any(s.name.startswith("heads.") and s.group.units(s.n) for s in analysis.spec)
    for layer in (0, 1):
        assert any(
            line.startswith(f"heads.{layer} (") and "fixed by a constant" in line
            for line in analysis.left_out
        ), analysis.left_out
        # the bases inside each head outlive the head permutation: a space per head
        for kind in ("qk", "value"):
            per_head = [s for s in analysis.spec if s.name.startswith(f"heads.{layer}.{kind}.")]
            assert len(per_head) == 4 and all(s.nest is None for s in per_head)
    # what is kept keeps the function
    assert lmckit.check_spec(model, analysis.spec, (x,))["all"] < 1e-12


def test_the_command_line_aligns_what_is_left(tmp_path: Path) -> None:
    for name, seed in (("a", 0), ("b", 1)):
        _bloom(seed).save_pretrained(tmp_path / name)
    listing = CliRunner().invoke(main, ["symmetries", str(tmp_path / "a")])
    assert listing.exit_code == 0, listing.output
    assert "heads.0" in listing.output and "left out" in listing.output
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["align", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert (out / "config.json").is_file() and "Traceback" not in result.output
