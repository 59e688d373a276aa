"""``lmckit curve``, ``landscape``, ``ensemble`` and ``soup`` end to end on digits: what they
write, the properties of what they measure, and one line for each bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from lmckit.cli import main
from lmckit.data import batches, load_digits
from lmckit.formats._io import load_model
from lmckit.measure._evaluate import evaluate
from lmckit.paths import evaluate_curve
from lmckit.workflow import load_curve

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TRAIN = ["--data", "digits", "--epochs", "6", "--optimizer", "adam", "--lr", "3e-3",
         "--batch-size", "64", "--quiet", "--threads", "1"]  # fmt: skip
PATH_KEYS = {"t", "loss", "acc", "barrier_loss", "barrier_acc"}


def _invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _ok(*args: str | Path) -> Result:
    result = _invoke(*args)
    assert result.exit_code == 0, f"{args}: {result.output}\n{result.exception!r}"
    return result


def _error(*args: str | Path) -> str:
    """The one-line error of a command that must fail as a user mistake."""
    result = _invoke(*args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("Error: ") and "Traceback" not in result.output, result.output
    return lines[-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Three MLPs 64-64-64-10 (seeds 0, 1, 2), a narrower one, and a Bezier curve and an
    elastic band between the first two."""
    root = tmp_path_factory.mktemp("curves")
    for seed in (0, 1, 2):
        _ok("train", "--model", "mlp", "--width", "64", "--depth", "2", "--seed", seed,
            "--out", root / f"m{seed}", *TRAIN)  # fmt: skip
    _ok("train", "--model", "mlp", "--width", "32", "--depth", "2", "--seed", 3,
        "--out", root / "narrow", *TRAIN)  # fmt: skip
    # a few epochs of digits: the band at lr 0.1 (the default 0.02 suits MNIST's 8,000
    # images and its 10 epochs)
    for kind, lr in (("bezier", "1e-3"), ("neb", "0.1")):
        _ok("curve", root / "m0", root / "m1", "--kind", kind, "--data", "digits",
            "--epochs", "4", "--lr", lr, "--batch-size", "64", "--out", root / kind, "--json",
            root / f"{kind}.json", "--plot", root / f"{kind}.png", "--quiet",
            "--threads", "1")  # fmt: skip
    return root


def test_curves_bend_around_the_lines_barrier(runs) -> None:
    for kind in ("bezier", "neb"):
        path = json.loads((runs / f"{kind}.json").read_text())
        assert PATH_KEYS <= set(path) and path["t"][0] == 0.0 and path["t"][-1] == 1.0
        assert len(path["t"]) == 11 and path["meta"]["method"] == kind
        line = path["linear"]["barrier_loss"]
        assert line > 0.3
        assert (runs / f"{kind}.png").read_bytes()[:8] == PNG_MAGIC
    # the band: a quarter of the line's barrier or less (the Bezier curve, with 4 epochs of
    # digits, gets part of the way)
    neb = json.loads((runs / "neb.json").read_text())
    assert neb["barrier_loss"] <= neb["linear"]["barrier_loss"] / 4
    bezier = json.loads((runs / "bezier.json").read_text())
    assert bezier["barrier_loss"] < bezier["linear"]["barrier_loss"] / 2


def test_a_curve_folder_holds_checkpoints_and_measures_as_it_was_measured(runs) -> None:
    loaded = load_curve(runs / "neb")
    names = loaded.record.points
    assert names[0] == "pivot-1" and len(names) == len(loaded.curve.controls) >= 3
    for name in names:  # each pivot is a model lmckit (and the user) can load alone
        assert load_model(runs / "neb" / name).module.__class__.__name__ == "MLP"
    data = load_digits(seed=0)
    path = evaluate_curve(loaded.form.module, loaded.curve,
                          lambda: batches(data.x_test, data.y_test, 500), points=11)  # fmt: skip
    assert path.loss == pytest.approx(json.loads((runs / "neb.json").read_text())["loss"], rel=1e-5)


def test_the_landscape_of_three_models(runs, tmp_path) -> None:
    out = _ok("landscape", runs / "m0", runs / "m1", runs / "m2", "--data", "digits",
              "--resolution", "5", "--json", tmp_path / "l.json", "--plot", tmp_path / "l.png",
              "--quiet").output  # fmt: skip
    assert "loss" in out and (tmp_path / "l.png").read_bytes()[:8] == PNG_MAGIC
    result = json.loads((tmp_path / "l.json").read_text())
    grid = result["grid"]
    assert len(grid["x"]) == len(grid["y"]) == 5
    assert len(grid["loss"]) == 5 and all(len(row) == 5 for row in grid["loss"])
    data = load_digits(seed=0)
    for entry, name in zip(result["models"], ("m0", "m1", "m2"), strict=True):
        assert entry["path"] == name and len(entry["xy"]) == 2
        own = evaluate(load_model(runs / name).module, load_model(runs / name).params,
                       batches(data.x_test, data.y_test, 500))  # fmt: skip
        assert entry["loss"] == pytest.approx(own.loss, rel=1e-6)
        assert entry["plane_loss"] == pytest.approx(own.loss, rel=0.02)
    assert result["models"][0]["xy"] == [0.0, 0.0] and result["models"][1]["xy"][1] == 0.0
    # the middle of the grid, between three minima, is higher than every model
    assert max(map(max, grid["loss"])) > 3 * max(m["loss"] for m in result["models"])


def test_the_landscape_through_a_curve_draws_it(runs, tmp_path) -> None:
    _ok("landscape", runs / "m0", runs / "m1", runs / "bezier", "--data", "digits",
        "--resolution", "3", "--json", tmp_path / "l.json", "--plot", tmp_path / "l.png",
        "--quiet")  # fmt: skip
    result = json.loads((tmp_path / "l.json").read_text())
    assert result["models"][2]["path"] == "bezier (middle point)"
    curve = result["curve"]
    b_x = result["models"][1]["xy"][0]
    # a quadratic Bezier curve lies in the plane of its ends and control point
    assert curve[0] == pytest.approx([0.0, 0.0], abs=1e-4)
    assert curve[-1] == pytest.approx([b_x, 0.0], abs=1e-4)
    assert max(y for _, y in curve) == pytest.approx(result["models"][2]["xy"][1] / 2, rel=1e-3)


def test_a_curve_ensemble_beside_its_endpoints(runs, tmp_path) -> None:
    _ok("ensemble", runs / "neb", "--data", "digits", "--points", "5", "--json",
        tmp_path / "e.json", "--quiet")  # fmt: skip
    result = json.loads((tmp_path / "e.json").read_text())
    assert set(result) >= {"ensemble", "endpoints", "pair_ensemble", "soup"}
    assert all(set(result[k]) == {"acc", "loss"} for k in ("ensemble", "pair_ensemble", "soup"))
    best = max(e["acc"] for e in result["endpoints"])
    assert result["ensemble"]["acc"] >= best
    # two unaligned networks do not average: their soup is far worse than either
    assert result["soup"]["acc"] < best - 0.1
    _ok("ensemble", runs / "neb", "--data", "digits", "--points", "2", "--json",
        tmp_path / "e2.json", "--quiet")  # fmt: skip
    two = json.loads((tmp_path / "e2.json").read_text())
    assert two["ensemble"] == two["pair_ensemble"]  # two points of a curve: its ends


def test_soups_uniform_greedy_and_aligned(runs, tmp_path) -> None:
    a = load_model(runs / "m0")
    data = load_digits(seed=0)
    own = evaluate(a.module, a.params, batches(data.x_test, data.y_test, 500))
    _ok("soup", runs / "m0", runs / "m0", "--data", "digits", "--out", tmp_path / "same")
    same = load_model(tmp_path / "same")
    assert all(torch.allclose(same.params[k], a.params[k]) for k in a.params)
    naive = _ok("soup", runs / "m0", runs / "m1", "--data", "digits", "--out", tmp_path / "n")
    aligned = _ok("soup", runs / "m0", runs / "m1", "--data", "digits", "--align", "weight",
                  "--out", tmp_path / "w")  # fmt: skip

    def soup_loss(output: str) -> float:
        return float(
            next(ln for ln in output.splitlines() if ln.startswith("uniform soup")).split()[-2]
        )

    assert soup_loss(aligned.output) < soup_loss(naive.output)
    greedy = _ok("soup", runs / "m0", runs / "m1", runs / "m2", "--data", "digits", "--greedy",
                 "--out", tmp_path / "g")  # fmt: skip
    assert "greedy soup" in greedy.output and own.loss > 0


def test_max_seconds_writes_the_curve_as_it_is(runs, tmp_path) -> None:
    out = _ok("curve", runs / "m0", runs / "m1", "--data", "digits", "--max-seconds", "1e-9",
              "--out", tmp_path / "c", "--quiet").output  # fmt: skip
    assert "1 of " in out and "stopped by --max-seconds" in out
    assert load_curve(tmp_path / "c").record.info["steps"] == 1


def test_bad_input_gets_one_line(runs, tmp_path) -> None:
    m0, m1, m2 = runs / "m0", runs / "m1", runs / "m2"
    files = ["--json", tmp_path / "x.json", "--plot", tmp_path / "x.png"]
    assert "different architectures" in _error(
        "landscape", m0, m1, runs / "narrow", "--data", "digits", *files)  # fmt: skip
    _ok("merge", m0, m1, "--out", tmp_path / "mid")
    assert "collinear" in _error("landscape", m0, m1, tmp_path / "mid", "--data", "digits", *files)
    assert "--resolution must be between 2" in _error(
        "landscape", m0, m1, m2, "--data", "digits", "--resolution", "1", *files)  # fmt: skip
    assert "--pivots, --cycles" in _error(
        "curve", m0, m1, "--data", "digits", "--pivots", "5", "--out", tmp_path / "c")  # fmt: skip
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    assert "not a curve folder lmckit wrote" in _error(
        "curve", m0, m1, "--data", "digits", "--out", user)  # fmt: skip
    assert (user / "notes.txt").read_text() == "mine"


def test_a_curve_whose_endpoints_moved_is_refused(runs, tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(runs / "m0", a)
    shutil.copytree(runs / "m1", b)
    _ok("curve", a, b, "--data", "digits", "--epochs", "1", "--out", tmp_path / "c", "--quiet")
    shutil.rmtree(b)
    shutil.copytree(runs / "m2", b)  # B retrained in place
    files = ["--json", tmp_path / "x.json", "--plot", tmp_path / "x.png"]
    assert "whose weights have changed" in _error(
        "landscape", a, b, tmp_path / "c", "--data", "digits", *files)  # fmt: skip
    assert "whose weights have changed" in _error("ensemble", tmp_path / "c", "--data", "digits")
    shutil.rmtree(b)
    assert "no longer there" in _error("ensemble", tmp_path / "c", "--data", "digits")
