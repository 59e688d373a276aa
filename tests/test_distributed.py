"""Data split across processes: two CPU processes (gloo) give one process's numbers.

The same computation (:func:`_compute`) runs once in this process without a process
group and once in each of two processes started with ``torch.multiprocessing.spawn``
and joined into a gloo group through :func:`lmckit.runtime.init_from_env` (what
``torchrun`` sets up). Path evaluation (batched and point by point), a single
evaluation, a simplex, activation statistics, activation matching, learned matching
(with and without BatchNorm) and weight matching (both schedules) must agree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.processes import rendezvous, set_rank_environment
from tests.recorded import RecordedParams
from tests.tiny_models import FOUR_HEADS

from lmckit.aligners import (
    ActivationMatchingConfig,
    LearnedMatchingConfig,
    WeightMatchingConfig,
    activation_matching,
    learned_matching,
    weight_matching,
)
from lmckit.aligners._cross_statistics import collect_cross_statistics
from lmckit.data import batches, load_digits
from lmckit.forms._recipe import spec_of
from lmckit.forms._rewrites import layernorm_to_rmsnorm
from lmckit.measure._batched import Batching
from lmckit.measure._evaluate import evaluate, evaluate_path
from lmckit.models import create_model
from lmckit.paths import evaluate_simplex
from lmckit.runtime._distributed import (
    any_rank,
    computed_once,
    init_from_env,
    is_distributed,
    local,
    rank_rows,
    shard,
    sum_gradients,
    sum_over_ranks,
    world,
)

PROCESSES = 2
# identity start and a large step: the learned permutations move within a few steps
LEARNED = LearnedMatchingConfig(
    steps=8, batch_size=33, eval_every=2, patience=10, lr=0.5, weight_matching_init=False
)


def _matrices(spec: Any, transform: Any) -> dict[str, torch.Tensor]:
    return {s.name: s.group.matrix(transform[s.name]) for s in spec}


def _compute() -> dict[str, Any]:
    """Everything compared; run with or without a process group."""
    torch.set_num_threads(1)
    data = load_digits(seed=0)
    kw = dict(in_features=64, hidden=[16, 16], out_features=10)
    model, a = create_model("mlp", seed=0, **kw)
    _, b = create_model("mlp", seed=1, **kw)
    _, c = create_model("mlp", seed=2, **kw)
    x, y = data.x_test, data.y_test
    # 360 test examples in batches of 50: 8 batches, the last of 10 (uneven shares)
    test = lambda: batches(x, y, 50)  # noqa: E731
    out: dict[str, Any] = {}
    for mode in ("batched", "loop"):
        path = evaluate_path(model, a, b, test, points=5, batching=Batching(mode=mode))
        out[f"path_{mode}"] = (path.loss, path.acc)
    m = evaluate(model, a, test())
    out["evaluate"] = (m.loss, m.acc)
    # one batch for two processes: the second evaluates nothing and still gets the figures
    m = evaluate(model, b, [(x[:7], y[:7])])
    out["one_batch"] = (m.loss, m.acc)
    simplex = evaluate_simplex(
        model, [a, b, c], test, resolution=2, batching=Batching(mode="batched")
    )
    out["simplex"] = (simplex.loss, simplex.acc)
    spec = model.symmetry_spec()
    inputs = [xb for xb, _ in batches(data.x_train, data.y_train, 100, limit=5)]
    stats = collect_cross_statistics(model, spec, a, b, inputs)
    out["stats"] = {n: (st.count, st.sum_ab, st.correlation()) for n, st in stats.items()}
    am = activation_matching(
        spec, a, b, ActivationMatchingConfig(batch_size=100, batches=5), model=model, data=data
    )
    out["activation_matching"] = _matrices(spec, am.transform)
    for norm in ("none", "batch"):
        net, pa = create_model("mlp", seed=0, norm=norm, **kw)
        _, pb = create_model("mlp", seed=1, norm=norm, **kw)
        net_spec = net.symmetry_spec()
        lm = learned_matching(net_spec, pa, pb, LEARNED, model=net, data=data, seed=3)
        out[f"learned_{norm}"] = (_matrices(net_spec, lm.transform), lm.history, lm.iterations)
    # weight matching: each step's spaces solved on different processes (heads with a
    # basis nested in each, MLP units, the residual stream; both schedules)
    gpt, ga = create_model("gpt2", seed=0, **FOUR_HEADS["gpt2"])
    _, gb = create_model("gpt2", seed=1, **FOUR_HEADS["gpt2"])
    gpt_spec = gpt.symmetry_spec()
    for schedule in ("sequential", "coloured"):
        config = WeightMatchingConfig(start="identity", schedule=schedule)
        wm = weight_matching(gpt_spec, ga, gb, config, seed=4)
        out[f"weight_{schedule}"] = (_matrices(gpt_spec, wm.transform), wm.history)
    # an orthogonal residual stream from the anchored start: each process reads only its
    # own parameters; the residual's terms are split between them
    rms, ra = layernorm_to_rmsnorm(gpt, ga)
    _, rb = layernorm_to_rmsnorm(gpt, gb)
    lazy_a, lazy_b = RecordedParams(ra), RecordedParams(rb)
    wm = weight_matching(rms.symmetry_spec(), lazy_a, lazy_b, WeightMatchingConfig(), seed=4)
    out["weight_orthogonal"] = (_matrices(rms.symmetry_spec(), wm.transform), wm.history)
    out["reads"] = (set(lazy_a.reads), set(lazy_b.reads))
    # the spec is inferred and checked by process 0 alone, which reads the values
    counted = RecordedParams(ga)
    out["spec"] = [(s.name, type(s.group).__name__) for s in spec_of(gpt, params=counted)]
    out["spec_reads"] = set(counted.reads)
    if is_distributed():
        try:  # fewer input batches than processes: every process stops with the same error
            collect_cross_statistics(model, spec, a, b, inputs[:1])
        except ValueError as err:
            out["too_few_batches"] = str(err)
    return out


def _raise(err: Exception) -> None:
    raise err


def _worker(rank: int, port: int, out_dir: str) -> None:
    set_rank_environment(rank, PROCESSES, port)
    assert init_from_env("gloo")
    try:
        assert world() == (rank, PROCESSES)
        with local():
            assert world() == (0, 1) and list(shard(range(3))) == [0, 1, 2]
        assert list(shard(range(5))) == [i for i in range(5) if i % PROCESSES == rank]
        assert any_rank(rank == 1) and not any_rank(False)
        grad = torch.nn.Parameter(torch.zeros(2))
        grad.grad = torch.full((2,), float(rank + 1))
        (summed,) = sum_gradients([grad], [torch.tensor(1.0)], mean=True)
        assert grad.grad.tolist() == [1.5, 1.5] and float(summed) == 1.0
        calls: list[int] = []
        assert computed_once(lambda: calls.append(rank) or 10 + rank) == 10
        assert calls == ([0] if rank == 0 else [])  # the others receive process 0's result
        with pytest.raises(ValueError, match="^from process 0$"):  # and its error
            computed_once(lambda: _raise(ValueError(f"from process {rank}")))
        torch.save(_compute(), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[dict]]:
    out_dir = tmp_path_factory.mktemp("ranks")
    with rendezvous() as (port,):
        mp.spawn(_worker, args=(port, str(out_dir)), nprocs=PROCESSES, join=True)
    ranks = [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(PROCESSES)]
    return _compute(), ranks


def _close(a: Any, b: Any, tol: float) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k], tol)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            _close(u, v, tol)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    else:
        assert a == pytest.approx(b, rel=tol, abs=tol)


@pytest.mark.parametrize(
    "key", ["path_batched", "path_loop", "evaluate", "one_batch", "simplex", "stats"]
)
def test_two_processes_measure_what_one_does(results, key: str) -> None:
    one, ranks = results
    for got in ranks:
        _close(got[key], one[key], 1e-9)


@pytest.mark.parametrize(
    "key",
    [
        "activation_matching",
        "learned_none",
        "learned_batch",
        "weight_sequential",
        "weight_coloured",
        "weight_orthogonal",
    ],
)
def test_two_processes_learn_the_same_transform(results, key: str) -> None:
    one, ranks = results
    for got in ranks:
        _close(got[key], one[key], 1e-5)
    if key.startswith("learned"):
        # the learned permutations moved away from the identity start: the test compares
        # a trajectory, not a fixed point
        matrices = one[key][0]
        assert any(not torch.equal(m, torch.eye(len(m))) for m in matrices.values())


def test_too_few_batches_stop_every_process_alike(results) -> None:
    _, ranks = results
    message = "activation statistics over 2 processes need at least 2 input batches"
    assert all(message in got["too_few_batches"] for got in ranks)


def test_without_a_process_group_everything_is_local() -> None:
    assert world() == (0, 1) and not is_distributed()
    assert list(shard("abc")) == ["a", "b", "c"]
    assert rank_rows(5) == slice(0, 5)
    t = torch.arange(3.0)
    (copy,) = sum_over_ranks([t])
    assert torch.equal(copy, t) and copy is not t
    assert any_rank(True) and not any_rank(False)
    assert computed_once(lambda: 3) == 3
    assert not init_from_env() or "WORLD_SIZE" in os.environ


def test_the_spec_is_inferred_once_and_shared(results) -> None:
    one, ranks = results
    assert ranks[0]["spec"] == ranks[1]["spec"] == one["spec"]
    assert ranks[0]["spec_reads"] == one["spec_reads"] and len(one["spec_reads"]) > 10
    assert ranks[1]["spec_reads"] == set()  # no value read for it


def test_each_process_reads_only_its_share_of_the_models(results) -> None:
    one, ranks = results
    for model in (0, 1):
        everything = one["reads"][model]
        shares = [r["reads"][model] for r in ranks]
        assert shares[0] | shares[1] == everything
        assert not shares[0] & shares[1]  # no tensor read twice
        # and the work is shared: each process reads a good part of the layers
        for share in shares:
            assert sum(".h." in k for k in share) >= 4
