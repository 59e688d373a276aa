"""Sweep steps: spaces solved together share nothing, and solving them together changes
nothing (one process; several processes are in tests/test_distributed.py)."""

from __future__ import annotations

import pytest
import torch
from tests.tiny_models import FOUR_HEADS

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.aligners._weight.incremental import SimilarityCache
from lmckit.aligners._weight.schedule import independent, sweep_steps
from lmckit.models import create_model
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import apply


def _gpt2():
    model, a = create_model("gpt2", seed=0, **FOUR_HEADS["gpt2"])
    _, b = create_model("gpt2", seed=1, **FOUR_HEADS["gpt2"])
    spec = model.symmetry_spec()
    cache = SimilarityCache(spec, a, b)
    deps = {n: cache.depends_on(n) for n in spec.names}
    nested = {n: [s.name for s in spec.nested_in(n)] for n in spec.names}
    return spec, a, b, deps, nested


def test_spaces_of_a_step_read_nothing_the_others_move() -> None:
    spec, _, _, deps, nested = _gpt2()
    order = [
        spec.names[i]
        for i in torch.randperm(len(spec.names), generator=torch.Generator().manual_seed(0))
    ]
    for schedule in ("sequential", "coloured"):
        steps = sweep_steps(order, deps, nested, schedule)
        assert sorted(n for step in steps for n in step) == sorted(order)  # each once
        for step in steps:
            for i, first in enumerate(step):
                for second in step[i + 1 :]:
                    # what solving one moves is not read by the other's subproblem
                    assert {second, *nested[second]}.isdisjoint(deps[first])
                    assert {first, *nested[first]}.isdisjoint(deps[second])
    # sequential keeps the order; coloured packs the spaces into a few large steps (the
    # residual stream reads every head and MLP space, which share nothing among them)
    sequential = sweep_steps(order, deps, nested, "sequential")
    assert [n for step in sequential for n in step] == order
    coloured = sweep_steps(order, deps, nested, "coloured")
    assert len(coloured) < len(sequential)
    assert max(len(step) for step in coloured) >= 4
    assert not independent("residual", "ffn.0", deps, nested)
    assert independent("ffn.0", "ffn.1", deps, nested)


def test_a_space_is_never_independent_of_itself_or_its_parent() -> None:
    spec, _, _, deps, nested = _gpt2()
    child = next(s for s in spec if s.nest is not None)
    assert not independent(child.name, child.name, deps, nested)
    assert not independent(child.nest.parent, child.name, deps, nested)


def test_the_coloured_schedule_recovers_a_planted_transform() -> None:
    spec, a, _, _, _ = _gpt2()
    planted = random_transform(spec, torch.Generator().manual_seed(3))
    b = apply(spec, a, planted)
    result = weight_matching(spec, a, b, WeightMatchingConfig(schedule="coloured"), seed=1)
    aligned = apply(spec, b, result.transform)
    before = sum(float((a[k] - b[k]).norm() ** 2) for k in a)
    after = sum(float((a[k] - aligned[k]).norm() ** 2) for k in a)
    assert after < 1e-8 * before


def test_an_unknown_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="schedule must be one of sequential, coloured"):
        WeightMatchingConfig(schedule="random")  # type: ignore[arg-type]
