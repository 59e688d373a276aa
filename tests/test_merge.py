"""BatchNorm reset and REPAIR: statistics match their definitions, and merges get better."""

from __future__ import annotations

import pytest
import torch

from lmckit.aligners import weight_matching
from lmckit.data import batches
from lmckit.measure._evaluate import evaluate
from lmckit.measure._streamed import LinearPoint
from lmckit.merging._merge import channel_statistics, has_batchnorm, repair, reset_batchnorm
from lmckit.merging._methods import (
    get_merge_method,
    list_merge_methods,
    merge_info,
    path_prepare,
)
from lmckit.models import create_model
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import apply


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _clone(params: Params) -> Params:
    return {k: v.clone() for k, v in params.items()}


def _assert_unchanged(params: Params, before: Params) -> None:
    for k in before:
        assert torch.equal(params[k], before[k]), f"{k} was modified"


def test_reset_batchnorm_matches_direct_statistics() -> None:
    module, params = create_model(
        "mlp", seed=0, in_features=5, hidden=[4], out_features=2, norm="batch"
    )
    gen = _gen(1)
    inputs = [torch.randn(32, 5, generator=gen) * 3 + 1 for _ in range(4)]
    before = _clone(params)
    module_state = _clone(module.state_dict())
    out = reset_batchnorm(module, params, inputs)
    _assert_unchanged(params, before)
    _assert_unchanged(module.state_dict(), module_state)
    pre = [x @ params["layers.0.weight"].T + params["layers.0.bias"] for x in inputs]
    # momentum=None: a cumulative average of the batch mean and unbiased batch variance
    mean = torch.stack([p.mean(0) for p in pre]).mean(0)
    var = torch.stack([p.var(0, unbiased=True) for p in pre]).mean(0)
    torch.testing.assert_close(out["norms.0.running_mean"], mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["norms.0.running_var"], var, atol=1e-5, rtol=1e-5)
    assert int(out["norms.0.num_batches_tracked"]) == 4
    # the global mean of equal-size batches equals the mean over all data
    torch.testing.assert_close(mean, torch.cat(pre).mean(0), atol=1e-5, rtol=1e-5)
    # the module's own BatchNorm keeps its default momentum
    assert module.norms[0].momentum == 0.1


def test_reset_batchnorm_edge_cases() -> None:
    module, params = create_model("mlp", seed=0, in_features=5, hidden=[4], out_features=2)
    assert not has_batchnorm(module)
    same = reset_batchnorm(module, params, [])
    assert same == params and same is not params
    bn, bn_params = create_model(
        "mlp", seed=0, in_features=5, hidden=[4], out_features=2, norm="batch"
    )
    with pytest.raises(ValueError, match="at least one batch"):
        reset_batchnorm(bn, bn_params, [])


def test_channel_statistics_match_direct_computation() -> None:
    module, params = create_model("mlp", seed=0, in_features=5, hidden=[6], out_features=2)
    x = torch.randn(50, 5, generator=_gen(2))
    stats = channel_statistics(module, params, ["layers.0"], list(x.split(20)))
    pre = (x @ params["layers.0.weight"].T + params["layers.0.bias"]).double()
    torch.testing.assert_close(stats["layers.0"].mean, pre.mean(0))
    torch.testing.assert_close(stats["layers.0"].std, pre.std(0, unbiased=False))
    # a point of a path, computed when read (a LazyParams), gives the same statistics
    _, other = create_model("mlp", seed=1, in_features=5, hidden=[6], out_features=2)
    point = LinearPoint(params, other, 0.25, None)
    lazy = channel_statistics(module, point, ["layers.0"], list(x.split(20)))
    built = channel_statistics(module, dict(point), ["layers.0"], list(x.split(20)))
    torch.testing.assert_close(lazy["layers.0"].mean, built["layers.0"].mean)


@pytest.fixture(scope="module")
def aligned_bn_pair(bn_mlp_pair):
    spec = bn_mlp_pair.model.symmetry_spec()
    result = weight_matching(spec, bn_mlp_pair.a, bn_mlp_pair.b)
    return bn_mlp_pair.model, bn_mlp_pair.a, apply(spec, bn_mlp_pair.b, result.transform)


def _train_inputs(data, limit: int = 4):
    return lambda: [x for x, _ in batches(data.x_train, data.y_train, 256, limit=limit)]


def test_repair_sets_site_statistics_to_the_interpolated_endpoints(aligned_bn_pair, digits) -> None:
    model, a, b = aligned_bn_pair
    inputs = _train_inputs(digits)
    sites = model.repair_sites()
    before_a, before_b = _clone(a), _clone(b)
    repaired = repair(model, a, b, 0.5, inputs)
    _assert_unchanged(a, before_a)
    _assert_unchanged(b, before_b)
    stats_a = channel_statistics(model, a, sites, inputs())
    stats_b = channel_statistics(model, b, sites, inputs())
    stats_m = channel_statistics(model, repaired, sites, inputs())
    for s in sites:
        goal_mean = 0.5 * (stats_a[s].mean + stats_b[s].mean)
        goal_std = 0.5 * (stats_a[s].std + stats_b[s].std)
        scale = float(goal_std.mean())
        assert float((stats_m[s].mean - goal_mean).abs().max()) < 0.05 * scale, s
        rel = ((stats_m[s].std - goal_std).abs() / goal_std).max()
        assert float(rel) < 0.05, s


def test_repair_lowers_the_midpoint_loss(aligned_bn_pair, digits) -> None:
    model, a, b = aligned_bn_pair
    test = lambda: batches(digits.x_test, digits.y_test, 500)  # noqa: E731
    plain = evaluate(model, interpolate(a, b, 0.5), test())
    repaired = evaluate(model, repair(model, a, b, 0.5, _train_inputs(digits)), test())
    assert repaired.loss < plain.loss


def test_repair_on_a_plain_mlp_matches_statistics_and_helps(mlp_pair, digits) -> None:
    spec = mlp_pair.model.symmetry_spec()
    model, a = mlp_pair.model, mlp_pair.a
    b = apply(spec, mlp_pair.b, weight_matching(spec, a, mlp_pair.b).transform)
    inputs = _train_inputs(digits)
    repaired = repair(model, a, b, 0.5, inputs)
    sites = model.repair_sites()
    assert sites == ["layers.0", "layers.1"]
    stats_a = channel_statistics(model, a, sites, inputs())
    stats_b = channel_statistics(model, b, sites, inputs())
    stats_m = channel_statistics(model, repaired, sites, inputs())
    for s in sites:
        goal_std = 0.5 * (stats_a[s].std + stats_b[s].std)
        assert float(((stats_m[s].std - goal_std).abs() / goal_std).max()) < 0.05, s
    test = lambda: batches(digits.x_test, digits.y_test, 500)  # noqa: E731
    plain = evaluate(model, interpolate(a, b, 0.5), test())
    fixed = evaluate(model, repaired, test())
    assert fixed.loss < plain.loss


def test_repair_errors() -> None:
    module, params = create_model(
        "mlp", seed=0, in_features=4, hidden=[5], out_features=2, bias=False
    )
    inputs = lambda: [torch.randn(8, 4)]  # noqa: E731
    with pytest.raises(ValueError, match="'layers.0' has no bias"):
        repair(module, params, params, 0.5, inputs)
    with pytest.raises(ValueError, match="'nowhere' is not a module"):
        repair(module, params, params, 0.5, inputs, sites=["nowhere"])
    with pytest.raises(ValueError, match="at least one site"):
        repair(module, params, params, 0.5, inputs, sites=[])
    _, other = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=2, bias=False)
    with pytest.raises(ValueError, match="layers.0.weight"):
        repair(module, params, other, 0.5, inputs, sites=["layers.0"])


# --------------------------------------------------------------------------- registry


def test_merge_method_registry_lists_and_names_typos() -> None:
    assert list_merge_methods() == ["interpolate", "repair", "reset_bn"]
    for name in list_merge_methods():
        assert "https://arxiv.org/abs/" in merge_info(name).paper
    with pytest.raises(
        KeyError,
        match="unknown merge method 'repiar'; known merge methods: interpolate, repair, reset_bn",
    ):
        get_merge_method("repiar")


def test_registered_methods_are_the_merges_they_name(bn_mlp_pair, digits) -> None:
    model, a, b, _ = bn_mlp_pair
    inputs = lambda: [x for x, _ in batches(digits.x_train, digits.y_train, 128, limit=3)]  # noqa: E731
    t = 0.3
    merged = get_merge_method("interpolate")(a, b, t)
    for k, v in interpolate(a, b, t).items():
        assert torch.equal(merged[k], v)
    reset = get_merge_method("reset_bn")(a, b, t, model=model, inputs=inputs)
    expected = reset_batchnorm(model, interpolate(a, b, t), inputs())
    for k, v in expected.items():
        assert torch.equal(reset[k], v)
    repaired = get_merge_method("repair")(a, b, t, model=model, inputs=inputs)
    for k, v in repair(model, a, b, t, inputs).items():
        torch.testing.assert_close(repaired[k], v)
    assert path_prepare("interpolate", model, a, b, inputs) is None


def test_merge_methods_say_what_they_need(mlp_pair) -> None:
    model, a, b, _ = mlp_pair
    with pytest.raises(ValueError, match="^repair runs the network: give model$"):
        get_merge_method("repair")(a, b, 0.5)
    with pytest.raises(ValueError, match="^reset_bn needs training data: give inputs$"):
        get_merge_method("reset_bn")(a, b, 0.5, model=model)
    with pytest.raises(ValueError, match="reset_bn needs a network with BatchNorm layers; "):
        path_prepare("reset_bn", model, a, b, lambda: [])
