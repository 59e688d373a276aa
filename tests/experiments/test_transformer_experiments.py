"""Quick modes of the ViT-on-MNIST and character-level GPT-2 experiments."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lmckit.experiments import ExperimentContext, run_experiment

DATA_ROOT = Path(__file__).resolve().parents[3] / "shared" / "data"

ROWS = [
    "vanilla",
    "WM permutation",
    "vanilla (RMS form)",
    "WM permutation (RMS)",
    "WM orthogonal",
    "WM orthogonal + head bases",
    "WM orthogonal (circuit form)",
    "AM permutation",
    "AM permutation (units in heads)",
    "AM orthogonal",
    "AM orthogonal (circuit form)",
]


@pytest.mark.parametrize(
    ("name", "data", "learned"),
    [("vit-mnist", "mnist", True), ("gpt2-chars", "tinyshakespeare", False)],
)
def test_quick_rows_share_their_ends(tmp_path: Path, name: str, data: str, learned: bool) -> None:
    if not (DATA_ROOT / data).exists():
        pytest.skip(f"needs ../shared/data/{data}")
    ctx = ExperimentContext(tmp_path, DATA_ROOT, quick=True, seed=0, progress=False)
    rows = {r["method"]: r for r in run_experiment(name, ctx).rows}
    extra = ["learned orthogonal", "learned orthogonal (circuit form)"] if learned else []
    assert list(rows) == ROWS + extra
    first, last = rows["vanilla"]["loss"][0], rows["vanilla"]["loss"][-1]
    for method, row in rows.items():
        assert math.isfinite(row["barrier_loss"]), method
        assert len(row["loss"]) == 11, method
        # every rewrite and alignment keeps both models' functions: the same ends
        assert row["loss"][0] == pytest.approx(first, abs=1e-4), method
        assert row["loss"][-1] == pytest.approx(last, abs=1e-4), method
    assert (tmp_path / "results.json").exists()
