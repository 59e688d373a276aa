"""Linear assignment: both backends (lapx's JV, SciPy) reach the same optimum; a wrong
answer from the fast solver falls back to SciPy; bad input is a one-line error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from lmckit.groups import Orthogonal, _assignment
from lmckit.groups._assignment import assignment, assignment_backend, injective

needs_lapx = pytest.mark.skipif(_assignment._lapjvr is None, reason="lapx is not installed")


def _scipy_total(sim: torch.Tensor) -> float:
    rows, cols = linear_sum_assignment(sim.double().numpy(), maximize=True)
    return float(sim.double().numpy()[rows, cols].sum())


def _cases() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [
        torch.randn(50, 50, generator=gen),
        torch.randn(64, 64, generator=gen, dtype=torch.float64),
        torch.randint(0, 3, (40, 40), generator=gen).float(),  # many ties
        torch.zeros(7, 7),  # all ties
        torch.randn(1, 1, generator=gen),
        # low rank, like a similarity from few columns
        torch.randn(60, 2, generator=gen) @ torch.randn(2, 60, generator=gen),
    ]


@pytest.mark.parametrize("backend", ["lapx", "scipy"])
def test_both_backends_reach_the_optimum(backend: str, monkeypatch) -> None:
    if backend == "scipy":
        monkeypatch.setattr(_assignment, "_lapjvr", None)
    elif _assignment._lapjvr is None:
        pytest.skip("lapx is not installed")
    assert assignment_backend() == backend
    for sim in _cases():
        cols = assignment(sim)
        assert sorted(cols.tolist()) == list(range(sim.shape[0]))
        total = float(sim.double()[torch.arange(sim.shape[0]), cols].sum())
        assert total == pytest.approx(_scipy_total(sim), rel=1e-12, abs=1e-9)
    gen = torch.Generator().manual_seed(1)
    wide = torch.randn(9, 4, generator=gen)  # rows: 9 wide slots, columns: 4 units
    rows = injective(wide)
    assert len(set(rows.tolist())) == 4
    total = float(wide.double()[rows, torch.arange(4)].sum())
    assert total == pytest.approx(_scipy_total(wide), rel=1e-12)


@needs_lapx
def test_a_wrong_fast_answer_falls_back_to_scipy(monkeypatch) -> None:
    def broken(cost, **_):
        n = cost.shape[0]
        return np.arange(n), np.zeros(n, dtype=np.int64)  # every row to column 0

    monkeypatch.setattr(_assignment, "_lapjvr", broken)
    sim = torch.randn(12, 12, generator=torch.Generator().manual_seed(2))
    cols = assignment(sim)
    total = float(sim.double()[torch.arange(12), cols].sum())
    assert total == pytest.approx(_scipy_total(sim), rel=1e-12)


def test_non_finite_similarities_are_refused() -> None:
    sim = torch.randn(5, 5)
    sim[2, 3] = float("nan")
    with pytest.raises(ValueError, match="similarity matrix has NaN or infinite entries"):
        assignment(sim)


def test_the_callers_similarity_is_not_modified() -> None:
    sim = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))
    before = sim.clone()
    assignment(sim)
    assert torch.equal(sim, before)


def test_procrustes_restores_the_thread_count() -> None:
    # small SVDs run on one thread; the caller's setting comes back, the answer is the
    # same as on the caller's threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        sim = torch.randn(30, 30, generator=torch.Generator().manual_seed(4))
        found = Orthogonal().solve(sim)
        assert torch.get_num_threads() == 2
        u, _, vh = torch.linalg.svd(sim.double())
        torch.testing.assert_close(found, (u @ vh).float())
    finally:
        torch.set_num_threads(before)
