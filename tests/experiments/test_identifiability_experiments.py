"""Quick modes of the identifiability experiments reproduce the paper's directions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lmckit.diagnostics._identifiability import coherence, input_subspace
from lmckit.experiments import ExperimentContext, list_experiments, run_experiment
from lmckit.experiments._identifiability import coherence_embedding, swap_cost_summary

DATA_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_mnist = pytest.mark.skipif(
    not (DATA_ROOT / "mnist").exists(), reason=f"no MNIST under {DATA_ROOT}"
)


def _run(name: str, tmp_path: Path):
    ctx = ExperimentContext(out_dir=tmp_path, data_root=DATA_ROOT, quick=True, progress=False)
    result = run_experiment(name, ctx)
    assert (tmp_path / "results.json").exists() and (tmp_path / "table.txt").exists()
    assert all(Path(f).exists() for f in result.figures) and result.figures
    return result


def test_experiments_are_registered() -> None:
    assert {"asym-lmc", "kappa-sweep", "swap-costs", "coherence"} <= set(list_experiments())


@pytest.mark.parametrize("family", ["exact-copy", "random-frame"])
@pytest.mark.parametrize("copies", [1, 3, 8])
def test_coherence_embedding_has_coherence_one_over_copies(family: str, copies: int) -> None:
    emb = coherence_embedding(copies, 16, family, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(emb.T @ emb, torch.eye(2))
    assert coherence(emb) == pytest.approx(1 / copies, rel=1e-5)
    z = torch.randn(200, 2, generator=torch.Generator().manual_seed(1))
    assert coherence(input_subspace(z @ emb.T, explained=0.999)) == pytest.approx(1 / copies)
    with pytest.raises(ValueError, match="copies"):
        coherence_embedding(9, 16, family)


def test_swap_cost_summary() -> None:
    diag = torch.tensor([1.0, 1.0, 2.0])
    delta = torch.tensor([[0.0, -0.5, 3.0], [-0.5, 0.0, math.inf], [3.0, math.inf, 0.0]])
    summary = swap_cost_summary(delta, diag)
    assert summary["cheap_fraction"] == pytest.approx(2 / 6)
    assert summary["negative_fraction"] == pytest.approx(2 / 6)
    assert summary["rel_median"] == pytest.approx(0.375)  # finite: -0.25, -0.25, 1, 1


def test_coherence_quick_high_coherence_gives_low_barrier(tmp_path: Path) -> None:
    rows = _run("coherence", tmp_path).rows
    for row in rows:
        assert row["measured_coherence"] == pytest.approx(row["coherence"], rel=1e-4)
    exact = {r["copies"]: r["midpoint_barrier_mean"] for r in rows if r["family"] == "exact-copy"}
    assert exact[1] < 0.2 * exact[16]


def test_swap_costs_quick_centers_separate_with_intrinsic_dimension(tmp_path: Path) -> None:
    rows = {(r["intrinsic_dim"], r["kappa"]): r for r in _run("swap-costs", tmp_path).rows}
    assert rows[(2, 0.0)]["min_center_gap"] == 0.0  # kappa = 0: no centers at all
    assert rows[(2, 1.0)]["min_center_gap"] < rows[(32, 1.0)]["min_center_gap"]
    assert rows[(32, 1.0)]["cheap_fraction"] == 0.0
    assert rows[(2, 0.0)]["cheap_fraction"] > 0.3  # no centers: many cheap swaps


@needs_mnist
def test_kappa_sweep_quick_identity_is_near_optimal_only_for_large_kappa(tmp_path: Path) -> None:
    rows = [r for r in _run("kappa-sweep", tmp_path).rows if r["layer"] == "all"]
    by_kappa = {r["kappa"]: r for r in rows}
    assert by_kappa[1.0]["identity_gap"] < 0.2
    assert by_kappa[0.0]["identity_gap"] > 0.5
    assert by_kappa[1.0]["identity"] > by_kappa[1.0]["random_mean"] + 0.3


@needs_mnist
def test_asym_lmc_quick_large_kappa_has_a_low_unaligned_barrier(tmp_path: Path) -> None:
    rows = {r["model"]: r for r in _run("asym-lmc", tmp_path).rows}
    large = rows["wasym k=1"]["naive_loss_barrier"]
    assert large < 0.5 * rows["mlp"]["naive_loss_barrier"]
    assert large < 0.5 * rows["wasym k=0"]["naive_loss_barrier"]
