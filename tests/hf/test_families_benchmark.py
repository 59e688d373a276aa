"""``benchmarks/families.py`` (the numbers of docs/families.md) measures what it says.

One family, Llama, through the benchmark's own measure function: the components it
reports are those the architecture has, the planted element of the independent planter
is recovered (permuted and rotated), and its row renders into the page's table.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # families.py imports families_table by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def benchmark():
    yield _load("families"), _load("families_table")
    for name in ("families", "families_table"):
        sys.modules.pop(name, None)


def test_the_benchmark_measures_llama(benchmark, tmp_path: Path) -> None:
    families, table = benchmark
    row = families.measure("llama", tmp_path, runs=1)
    found = row["inference"]
    assert {"residual", "heads", "query", "value", "qk", "units"} <= set(found["components"])
    assert found["groups"]["qk"] == ["RotaryPlanes"] and found["left_out"] == []
    assert found["moved"] == pytest.approx(1.0) and found["time_s"] > 0
    assert row["orthogonal"] == {
        "admits": True,
        "groups": ["Orthogonal"],
        "form": "norm scales folded",
    }
    for key, stream in (("planted", "residual"), ("rotated", "residual rotation")):
        plant = row[key]
        assert stream in plant["maps"] and "qk (half)" in plant["maps"]
        assert plant["plant_keeps_outputs"] < 1e-4 and plant["before"] > 0.5
        assert plant["left"] < 1e-4 and plant["b_outputs_kept"] < 1e-4
    report = {"command": "x", "date": "d", "wall_s": 1.0, "threads": 2, "families": [row]}
    line = table.markdown(report).splitlines()[-1]
    assert line.startswith("| Llama | residual, heads, query (HeadPermutation)")
    assert "| R R⊥ U H Q V QK-half | yes: " in line
    # the page keeps its text around the tables it is given again
    page = table.splice("intro\n" + table.splice("", report) + "outro\n", report)
    assert page.startswith("intro\n" + table.BEGIN) and page.endswith(table.END + "\noutro\n")
    assert page.count("| Llama |") == 1


def test_a_family_that_is_not_in_the_zoo_is_refused_in_one_line(benchmark) -> None:
    families, _ = benchmark
    with pytest.raises(SystemExit, match="unknown families \\['llama3'\\]"):
        families.main(["--only", "llama3", "--json", "-"])
