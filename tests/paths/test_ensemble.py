"""Ensembles of parameter sets: each group's averaged outputs scored as one model, checked
against the averages computed directly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmckit.data import batches
from lmckit.measure._evaluate import evaluate
from lmckit.paths import EnsembleResult, ensemble_metrics
from lmckit.paths._ensemble import even_ts
from lmckit.symmetry._average import interpolate
from lmckit.training._task import mse


def _logits(model, params, x):
    model.eval()
    with torch.no_grad():
        return torch.func.functional_call(model, params, (x,)).double()


def test_groups_are_scored_as_their_averaged_outputs(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    mid = interpolate(a, b, 0.5)
    members = [a, b, mid]
    groups = [[0], [1], [0, 1], [0, 1, 2]]
    test = lambda: batches(data.x_test, data.y_test, 100)  # noqa: E731
    by_logits = ensemble_metrics(model, members, groups, test)
    by_probs = ensemble_metrics(model, members, groups, test, combine="probabilities")
    x, y = data.x_test, data.y_test
    outs = [_logits(model, p, x) for p in members]
    for got, group in zip(by_logits, groups, strict=True):
        mean = sum(outs[i] for i in group) / len(group)
        assert got.loss == pytest.approx(float(F.cross_entropy(mean, y)), rel=1e-6)
        assert got.acc == pytest.approx(float((mean.argmax(1) == y).double().mean()))
    for got, group in zip(by_probs, groups, strict=True):
        probs = sum(torch.softmax(outs[i], 1) for i in group) / len(group)
        assert got.loss == pytest.approx(float(F.nll_loss(probs.log(), y)), rel=1e-6)
    # one member is that model, however combined
    alone = evaluate(model, a, test())
    for result in (by_logits, by_probs):
        assert result[0].loss == pytest.approx(alone.loss, rel=1e-6)
        assert result[0].acc == pytest.approx(alone.acc)


def test_bad_groups_and_combinations_are_refused(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    test = lambda: batches(data.x_test, data.y_test, 100)  # noqa: E731
    with pytest.raises(ValueError, match="group"):
        ensemble_metrics(model, [a, b], [[0, 2]], test)
    with pytest.raises(ValueError, match="combine"):
        ensemble_metrics(model, [a, b], [[0]], test, combine="median")
    with pytest.raises(ValueError, match="class scores"):
        ensemble_metrics(model, [a, b], [[0]], test, combine="probabilities", task=mse())
    with pytest.raises(ValueError, match="at least 2"):
        even_ts(1)


def test_an_ensemble_result_reads_back_its_json() -> None:
    from lmckit.measure._evaluate import Metrics

    m = Metrics(0.5, 0.9)
    result = EnsembleResult(m, [m, Metrics(0.6, 0.8)], m, Metrics(2.0, 0.3), [0.0, 1.0], {"k": 2})
    data = result.to_dict()
    assert set(data) == {"ensemble", "endpoints", "pair_ensemble", "soup", "ts", "meta"}
    assert data["endpoints"][1] == {"loss": 0.6, "acc": 0.8}
    assert EnsembleResult.from_dict(data) == result
