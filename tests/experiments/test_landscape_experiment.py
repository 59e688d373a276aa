"""``reproduce landscape --quick``: the rows the docs read, in their quick form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmckit.experiments import ExperimentContext, run_experiment

DATA_ROOT = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.mark.skipif(not (DATA_ROOT / "mnist").exists(), reason=f"no MNIST under {DATA_ROOT}")
def test_landscape_quick(tmp_path: Path) -> None:
    ctx = ExperimentContext(out_dir=tmp_path, data_root=DATA_ROOT, quick=True, progress=False)
    result = run_experiment("landscape", ctx)
    assert [f.name for f in result.figures] == ["planes.png", "paths.png"]
    rows = {r["path"]: r for r in result.rows if "path" in r}
    assert set(rows) == {"linear", "bezier", "neb", "linear, B weight-matched"}
    line = rows["linear"]["barrier_loss"]
    assert rows["neb"]["barrier_loss"] < line and rows["bezier"]["barrier_loss"] < line
    assert rows["linear, B weight-matched"]["barrier_loss"] < line
    planes = [r for r in result.rows if "plane" in r]
    assert {p["plane"] for p in planes} == {"unaligned", "aligned", "through the Bezier curve"}
    assert len(planes) == 9
    for p in planes:  # each model on each plane: the plane's point there is that model
        assert p["plane_loss"] == pytest.approx(p["loss"], rel=1e-5)
    assert json.loads((tmp_path / "results.json").read_text())["rows"]
