"""The MNIST experiments in their quick form: finite barriers, weight matching helps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import lmckit
from lmckit.experiments import ExperimentContext, list_experiments, run_experiment

# The checkout is <root>/main; the shared data sits beside it in <root>/shared/data.
DATA_ROOT = Path(__file__).resolve().parents[3] / "shared" / "data"

needs_mnist = pytest.mark.skipif(
    not (DATA_ROOT / "mnist").exists(), reason=f"no MNIST under {DATA_ROOT}"
)


def _run(name: str, out: Path) -> dict:
    ctx = ExperimentContext(out_dir=out, data_root=DATA_ROOT, quick=True, progress=False)
    result = run_experiment(name, ctx)
    assert all(fig.is_file() for fig in result.figures)
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result.rows))
    return {row["path"]: row for row in result.rows}


def _assert_finite(rows: dict) -> None:
    for row in rows.values():
        for key in ("barrier_loss", "barrier_acc", "midpoint_loss", "midpoint_acc"):
            assert math.isfinite(row[key]), (row["path"], key)
        assert all(math.isfinite(v) for v in row["loss"] + row["acc"])


def test_experiments_are_registered() -> None:
    assert {"mnist-mlp", "resnet20-mnist", "resnet20-ln-mnist"} <= set(list_experiments())


@needs_mnist
def test_mnist_mlp_quick_barriers_and_checkpoint_reuse(tmp_path: Path) -> None:
    rows = _run("mnist-mlp", tmp_path)
    assert set(rows) == {"naive", "weight_matching", "activation_matching"}
    _assert_finite(rows)
    naive = rows["naive"]["barrier_loss"]
    assert rows["weight_matching"]["barrier_loss"] < naive
    assert rows["activation_matching"]["barrier_loss"] < naive
    # the same two endpoints on every path: alignment preserves each model's function
    ends = {(round(r["loss"][0], 5), round(r["loss"][-1], 5)) for r in rows.values()}
    assert len(ends) == 1
    assert rows["weight_matching"]["meta"]["align_sweeps"] >= 1
    # a rerun reloads the saved checkpoints (lmckit checkpoints) instead of retraining
    (saved,) = tmp_path.glob("quick-*/models/mlp-seed0")
    assert lmckit.load(saved).config.kwargs["hidden"] == [128, 128]
    again = _run("mnist-mlp", tmp_path)
    assert again["naive"]["loss"] == rows["naive"]["loss"]
    assert "train mlp" not in json.loads((tmp_path / "results.json").read_text())["notes"]


@needs_mnist
@pytest.mark.parametrize(
    ("name", "fixes"),
    [
        ("resnet20-mnist", ("BN reset", "REPAIR")),
        # the LayerNorm variant runs the same code path: kept out of the default run
        pytest.param("resnet20-ln-mnist", ("no fix", "REPAIR"), marks=pytest.mark.slow),
    ],
)
def test_resnet20_quick_rows_are_finite(tmp_path: Path, name: str, fixes: tuple) -> None:
    rows = _run(name, tmp_path)
    assert set(rows) == {f"{m} + {f}" for m in ("naive", "weight_matching") for f in fixes}
    _assert_finite(rows)
    # the endpoint A (t = 0) is the same model whichever B it is paired with
    for fix in fixes:
        assert rows[f"naive + {fix}"]["loss"][0] == pytest.approx(
            rows[f"weight_matching + {fix}"]["loss"][0], rel=1e-4
        )
