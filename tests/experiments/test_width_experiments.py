"""Quick modes of the width-sweep (MLP, VGG, ResNet20), weight-decay and bezier experiments."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lmckit.experiments import ExperimentContext, list_experiments, run_experiment

DATA_ROOT = Path(__file__).resolve().parents[3] / "shared" / "data"

pytestmark = pytest.mark.skipif(
    not (DATA_ROOT / "mnist").exists(), reason="shared MNIST data not available"
)


def _run(name: str, out: Path):
    ctx = ExperimentContext(out, DATA_ROOT, quick=True, seed=0, progress=False)
    return run_experiment(name, ctx)


def test_registered():
    assert {"width-sweep", "weight-decay", "bezier"} <= set(list_experiments())


def test_width_sweep_quick(tmp_path):
    result = _run("width-sweep", tmp_path)
    assert {(r["weight_decay"], r["multiplier"]) for r in result.rows} == {
        (wd, m) for wd in (3e-3, 1e-4) for m in (1, 4)
    }
    for r in result.rows:
        naive, wm = r["paths"]["naive"], r["paths"]["weight_matching"]
        # both paths start at the same model A, calibrated on the same images
        assert (wm["loss"][0], wm["acc"][0]) == (naive["loss"][0], naive["acc"][0])
        # weight matching only permutes B: its end of the path is the same function
        assert wm["acc"][-1] == naive["acc"][-1]
        assert wm["loss"][-1] == pytest.approx(naive["loss"][-1], abs=1e-5)
    assert (tmp_path / "results.json").exists() and result.figures


@pytest.mark.slow
def test_weight_decay_quick(tmp_path):
    result = _run("weight-decay", tmp_path)
    assert [r["weight_decay"] for r in result.rows] == [1e-4, 1e-3, 3e-3]
    for r in result.rows:
        # cosines of non-negative (post-ReLU) vectors lie in [0, 1]
        assert all(0.0 <= v <= 1.0 + 1e-9 for v in r["weak_additivity"].values())
        assert all(1.0 <= v <= r["width"] for v in r["effective_rank"].values())


def test_bezier_quick(tmp_path):
    result = _run("bezier", tmp_path)
    rows = {r["path"]: r for r in result.rows}
    assert rows["linear"]["barrier_loss"] > 0.0
    assert rows["bezier"]["barrier_loss"] < rows["linear"]["barrier_loss"]
    assert rows["chain"]["barrier_loss"] < rows["linear"]["barrier_loss"]
    # the curve shares the line's ends: same curvature there, CKA 1 with itself at t=0
    lin, bez = rows["linear"]["diagnostics"], rows["bezier"]["diagnostics"]
    assert bez["top_eigenvalue"]["t=0"] == pytest.approx(lin["top_eigenvalue"]["t=0"], rel=1e-3)


def _check_cnn_sweep(result, multipliers):
    assert {(r["weight_decay"], r["multiplier"]) for r in result.rows} == {
        (wd, m) for wd in (3e-3, 1e-4) for m in multipliers
    }
    numbers = (
        "acc_a",
        "acc_b",
        "naive_acc_barrier",
        "naive_loss_barrier",
        "wm_acc_barrier",
        "wm_loss_barrier",
        "naive_mid_acc",
        "naive_mid_acc_no_reset",
    )
    for r in result.rows:
        assert all(math.isfinite(r[k]) for k in numbers)
        naive, wm = r["paths"]["naive"], r["paths"]["weight_matching"]
        assert naive["meta"]["fix"] == wm["meta"]["fix"] == "reset_bn"
        # B's BatchNorm statistics are recomputed at t = 1 too: the permuted B gives the
        # same function after the reset, so both paths end at the same accuracy
        assert wm["acc"][-1] == pytest.approx(naive["acc"][-1], abs=1e-9)
        # resetting the statistics undoes the variance collapse of the averaged network:
        # with the endpoints' averaged running statistics the midpoint is no better
        assert r["naive_mid_acc"] >= r["naive_mid_acc_no_reset"]


def test_cnn_sweeps_registered():
    assert {"width-sweep-vgg", "width-sweep-resnet20"} <= set(list_experiments())


def test_width_sweep_vgg_quick(tmp_path):
    result = _run("width-sweep-vgg", tmp_path)
    _check_cnn_sweep(result, (0.125, 0.5))
    # at the wider VGG, weight matching lowers both barriers (the quick ResNet20, trained
    # on 256 images for 8 steps, is too far from converged for this to hold)
    for r in result.rows:
        if r["multiplier"] == 0.5:
            assert r["wm_loss_barrier"] <= r["naive_loss_barrier"]
            assert r["wm_acc_barrier"] <= r["naive_acc_barrier"]
    # the wider net merges better with or without permutations
    for wd in (3e-3, 1e-4):
        narrow, wide = (r for r in result.rows if r["weight_decay"] == wd)
        assert wide["acc_a"] > narrow["acc_a"]
    assert len(result.figures) == 2


@pytest.mark.slow
def test_width_sweep_resnet20_quick(tmp_path):
    _check_cnn_sweep(_run("width-sweep-resnet20", tmp_path), (1,))
