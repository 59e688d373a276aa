"""The barrier table: alignment lowers the barrier between independently trained models."""

from __future__ import annotations

import pytest

from lmckit.experiments._compare import METHODS, align_pair, compare_alignments
from lmckit.measure._measure import EvalSettings, measure_path, path_table, train_inputs


@pytest.fixture(scope="module")
def mlp_results(mlp_pair):
    return compare_alignments(
        mlp_pair.model,
        mlp_pair.model.symmetry_spec(),
        mlp_pair.a,
        mlp_pair.b,
        mlp_pair.data,
        EvalSettings(points=5),
    )


def test_alignment_lowers_the_barrier(mlp_results) -> None:
    assert list(mlp_results) == list(METHODS)
    naive = mlp_results["naive"]
    assert naive.barrier_loss > 0.1  # independently trained: a real barrier
    assert mlp_results["weight_matching"].barrier_loss < naive.barrier_loss
    assert mlp_results["activation_matching"].barrier_loss < naive.barrier_loss
    # the endpoints are the same models whatever the method
    for r in mlp_results.values():
        assert r.loss[0] == pytest.approx(naive.loss[0])
        assert r.loss[-1] == pytest.approx(naive.loss[-1], rel=1e-5)
        assert r.meta["split"] == "test" and r.meta["fix"] == "none"
    assert mlp_results["weight_matching"].meta["align_sweeps"] >= 1


def test_path_table_lists_every_method(mlp_results) -> None:
    table = path_table(mlp_results)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["method", "loss", "barrier"]
    assert len(lines) == 2 + len(METHODS)
    wm = next(line for line in lines if line.startswith("weight_matching"))
    assert f"{mlp_results['weight_matching'].barrier_loss:.4f}" in wm


def test_bn_pair_auto_fix_resets_batchnorm(bn_mlp_pair) -> None:
    pair = bn_mlp_pair
    settings = EvalSettings(points=3)
    auto = measure_path(pair.model, pair.a, pair.b, pair.data, settings)
    assert auto.meta["fix"] == "reset_bn"
    plain = measure_path(pair.model, pair.a, pair.b, pair.data, EvalSettings(points=3, fix="none"))
    # interpolated running statistics are wrong; recomputing them helps the midpoint
    assert auto.midpoint_loss < plain.midpoint_loss


def test_errors(mlp_pair) -> None:
    pair = mlp_pair
    spec = pair.model.symmetry_spec()
    with pytest.raises(ValueError, match="split"):
        EvalSettings(split="val")
    with pytest.raises(ValueError, match="fix"):
        EvalSettings(fix="magic")
    with pytest.raises(ValueError, match="unknown aligner 'magic'"):
        align_pair("magic", pair.model, spec, pair.a, pair.b, pair.data)
    with pytest.raises(ValueError, match="activation_matching needs training data"):
        align_pair("activation_matching", pair.model, spec, pair.a, pair.b, None)
    assert align_pair("naive", pair.model, spec, pair.a, pair.b, None) is None
    with pytest.raises(ValueError, match="BatchNorm"):
        measure_path(pair.model, pair.a, pair.b, pair.data, EvalSettings(fix="reset_bn"))


# --------------------------------------------------------------------------- shared rules


def test_one_evaluation_batch_rule_bounds_language_model_logits() -> None:
    import torch

    from lmckit.data import Dataset
    from lmckit.measure._measure import LM_EVAL_LOGITS, eval_batch_size

    tokens = torch.zeros(4, 16, dtype=torch.int64)
    lm = Dataset("lm", tokens, tokens, tokens, tokens, num_classes=50257)
    # logits (batch, 16, 50257) stay within the budget, and one more example would not
    assert eval_batch_size(lm) == LM_EVAL_LOGITS // (16 * 50257) == 83
    assert (
        eval_batch_size(lm) * 16 * 50257 <= LM_EVAL_LOGITS < (eval_batch_size(lm) + 1) * 16 * 50257
    )
    feats = Dataset("f", torch.zeros(4, 3), torch.zeros(4).long(), torch.zeros(4, 3),
                    torch.zeros(4).long(), num_classes=2)  # fmt: skip
    assert eval_batch_size(feats) == 500 and eval_batch_size(lm, 7) == 7
    assert EvalSettings().batch_for(lm) == 83 and EvalSettings(batch_size=9).batch_for(lm) == 9


def test_fix_resolution(mlp_pair, bn_mlp_pair) -> None:
    from lmckit.measure._measure import resolve_fix

    assert resolve_fix(mlp_pair.model, "auto") == "none"
    assert resolve_fix(bn_mlp_pair.model, "auto") == "reset_bn"
    assert resolve_fix(mlp_pair.model, "repair") == "repair"


def test_data_fit_of_a_module_outside_the_zoo_names_both_numbers(digits) -> None:
    from torch import nn

    from lmckit.data._fit import DataMismatchError, check_data_fits

    check_data_fits(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), digits)
    with pytest.raises(DataMismatchError, match=r"has 7 outputs \(classes\) but digits has 10"):
        check_data_fits(nn.Sequential(nn.Flatten(), nn.Linear(64, 7)), digits)
    with pytest.raises(DataMismatchError, match=r"inputs of shape \(1, 8, 8\) do not fit"):
        check_data_fits(nn.Sequential(nn.Flatten(), nn.Linear(30, 10)), digits)


@pytest.mark.parametrize("fix", ["none", "reset_bn"])
def test_simplex_vertices_are_the_models_with_the_fix(bn_mlp_pair, fix: str) -> None:
    from pathlib import Path

    from lmckit.formats._io import LoadedModel
    from lmckit.measure._measure import evaluate_split
    from lmckit.merging._merge import reset_batchnorm
    from lmckit.workflow import simplex_barrier

    model, a, b, data = bn_mlp_pair
    settings = EvalSettings(fix=fix)
    loaded = [LoadedModel(model, p, "lmckit", Path(n), None) for p, n in ((a, "a"), (b, "b"))]
    result = simplex_barrier(loaded, data, settings, resolution=2)
    assert result.meta["fix"] == fix
    for params, weights in ((a, (1.0, 0.0)), (b, (0.0, 1.0))):
        inputs = train_inputs(data, settings)()
        fixed = reset_batchnorm(model, params, inputs) if fix == "reset_bn" else params
        expected = evaluate_split(model, fixed, data)
        at = result.loss[result.weights.index(weights)]
        assert at == pytest.approx(expected.loss, rel=1e-5)
        if fix == "reset_bn":  # the reset does change a vertex: the test can tell
            assert at != pytest.approx(evaluate_split(model, params, data).loss, rel=1e-5)
