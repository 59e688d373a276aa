"""Who reads what across processes: every parameter one owner, spaces whole on one
process where they can be, the residual stream split, the bytes balanced."""

from __future__ import annotations

import pytest

from lmckit.aligners._weight.sharding import param_bytes, shard_params
from lmckit.forms._rewrites import layernorm_to_rmsnorm
from lmckit.models import create_model

GPT2 = {"vocab_size": 17, "n_layer": 4, "n_head": 4, "n_embd": 16, "n_inner": 24, "context": 8}


@pytest.fixture(scope="module")
def gpt2() -> tuple:
    module, params = create_model("gpt2", seed=0, **GPT2)
    module, params = layernorm_to_rmsnorm(module, params)
    sizes = param_bytes(params)
    return module.symmetry_spec(), sizes


@pytest.mark.parametrize("size", [1, 2, 3])
def test_each_parameter_has_one_owner_and_spaces_stay_whole(gpt2, size: int) -> None:
    spec, sizes = gpt2
    shards = [shard_params(spec, sizes, rank=r, size=size) for r in range(size)]
    assert all(s.owner == shards[0].owner and s.solver == shards[0].solver for s in shards)
    owned = [s.owned() for s in shards]
    read = {u.param for space in spec for u in space.uses}
    assert set().union(*owned) == read  # every parameter read by exactly one process
    assert sum(len(o) for o in owned) == len(read)
    solver = shards[0].solver
    for space in spec:
        if space.nest is not None:  # a basis inside heads goes with its heads
            assert solver[space.name] == solver[space.nest.parent]
    if size == 1:
        assert set(solver.values()) == {0}
        return
    assert solver["residual"] == "split"  # it reads every layer
    # the heads and MLP units are solved whole, by the process owning their weights
    for space in spec:
        if space.name != "residual":
            assert isinstance(solver[space.name], int)
            owner = solver[space.name]
            assert all(shards[owner].owns(u.param) for u in space.uses if u.compare)
    # the bytes are balanced up to one layer
    loads = [sum(sizes[p] for p in o) for o in owned]
    layer = sum(v for k, v in sizes.items() if ".h.0." in k)
    assert max(loads) - min(loads) <= layer + max(sizes.values())
