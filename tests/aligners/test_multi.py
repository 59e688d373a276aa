"""Universe matching: planted recovery, cycle consistency, simplex barrier drop."""

from __future__ import annotations

import pytest
import torch

from lmckit.aligners import UniverseConfig, UniverseResult, universe_matching
from lmckit.data import Dataset, batches
from lmckit.models import create_model
from lmckit.paths import evaluate_simplex
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import Orthogonal, Transform, apply
from lmckit.training._train import TrainConfig, fit


@pytest.fixture(scope="module")
def three_mlps(mlp_pair, digits: Dataset):
    model, a, b, _ = mlp_pair
    _, init = create_model("mlp", seed=2, in_features=64, hidden=[64, 64], out_features=10)
    c = fit(
        model, init, digits, TrainConfig(epochs=6, batch_size=64, lr=3e-3), seed=2, progress=False
    ).params
    return model, [a, b, c]


def _universe(spec, models, config=None, **options) -> UniverseResult:
    """Universe matching of a list of models: the first two, then ``others``."""
    return universe_matching(spec, models[0], models[1], config, others=models[2:], **options)


def _matrices_equal(spec, x, y) -> bool:
    return all(torch.equal(s.group.matrix(x[s.name]), s.group.matrix(y[s.name])) for s in spec)


def test_recovers_permuted_copies_of_one_model(mlp_pair) -> None:
    model, a, _, _ = mlp_pair
    spec = model.symmetry_spec()
    copies = [a] + [apply(spec, a, random_transform(spec, seed)) for seed in (1, 2, 3)]
    result = _universe(spec, copies)
    assert result.converged
    for moved in result.aligned(spec, copies):
        for k in a:
            torch.testing.assert_close(moved[k], a[k])
    # model 0's frame is the universe
    assert all(torch.equal(result.transforms[0][s.name], torch.arange(s.n)) for s in spec)


def test_pairwise_maps_are_the_planted_maps_between_copies(mlp_pair) -> None:
    # copy k = P_k(a): the map from copy i to copy j is P_j P_i^{-1}, whatever frame
    model, a, _, _ = mlp_pair
    spec = model.symmetry_spec()
    planted = [Transform.identity(spec)] + [random_transform(spec, s) for s in (4, 5, 6)]
    copies = [apply(spec, a, p) for p in planted]
    result = universe_matching(spec, copies[0], copies[1], others=copies[2:], seed=3)
    for i, j in [(0, 1), (1, 2), (2, 0), (3, 1), (2, 3)]:
        truth = planted[j].compose(planted[i].inverse())
        found = result.pairwise(i, j)
        assert _matrices_equal(spec, found, truth), (i, j)
        moved = apply(spec, copies[i], found)
        for k in a:
            torch.testing.assert_close(moved[k], copies[j][k])
    # as an aligner, its transform aligns the second model to the first
    assert _matrices_equal(spec, result.transform, result.pairwise(1, 0))


def test_pairwise_maps_bring_trained_models_closer(three_mlps) -> None:
    model, models = three_mlps
    spec = model.symmetry_spec()
    result = universe_matching(spec, models[0], models[1], others=models[2:], seed=0)

    def inner(x, y) -> float:
        return sum(float((x[k].double() * y[k].double()).sum()) for k in x)

    for i, j in [(0, 1), (1, 2), (2, 0)]:
        moved = apply(spec, models[i], result.pairwise(i, j))
        assert inner(moved, models[j]) > inner(models[i], models[j])


def test_objective_never_decreases(three_mlps) -> None:
    model, models = three_mlps
    result = _universe(model.symmetry_spec(), models, seed=1)
    assert all(
        b >= a - 1e-6 * abs(a) for a, b in zip(result.history, result.history[1:], strict=False)
    )


def test_multi_model_barrier_drops(three_mlps, digits: Dataset) -> None:
    model, models = three_mlps
    spec = model.symmetry_spec()
    test = lambda: batches(digits.x_test, digits.y_test, 500)  # noqa: E731
    before = evaluate_simplex(model, models, test, resolution=4)
    result = _universe(spec, models)
    after = evaluate_simplex(model, result.aligned(spec, models), test, resolution=4)
    assert after.barrier_loss < 0.5 * before.barrier_loss
    assert after.vertex_loss == pytest.approx(before.vertex_loss, abs=1e-5)


def test_orthogonal_spaces_are_matched_too() -> None:
    model, a = create_model(
        "mlp", seed=0, in_features=6, hidden=[5], out_features=3, activation="relu"
    )
    spec = model.symmetry_spec().with_groups(**{"hidden.0": Orthogonal()})
    copies = [a] + [apply(spec, a, random_transform(spec, s)) for s in (1, 2)]
    result = _universe(spec, copies)
    for moved in result.aligned(spec, copies):
        for k in a:
            torch.testing.assert_close(moved[k], a[k], atol=1e-4, rtol=0)


def test_errors(mlp_pair) -> None:
    model, a, b, _ = mlp_pair
    spec = model.symmetry_spec()
    _, wide = create_model("mlp", seed=0, in_features=64, hidden=[64, 80], out_features=10)
    with pytest.raises(ValueError, match="layers.1.weight"):
        universe_matching(spec, a, b, others=[wide])
    with pytest.raises(ValueError):
        UniverseConfig(max_iter=0)


def _noisy_unseen_rows(params: dict, seen: torch.Tensor, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    out = dict(params)
    for key in ("transformer.wte.weight", "lm_head.weight"):
        out[key] = params[key].clone()
        out[key][~seen] = 100 * torch.randn(int((~seen).sum()), params[key].shape[1], generator=gen)
    return out


def test_universe_row_masks_ignore_unseen_token_rows() -> None:
    from lmckit.forms._rewrites import layernorm_to_rmsnorm

    kwargs = {"vocab_size": 17, "n_layer": 1, "n_head": 2, "n_embd": 8, "n_inner": 16}
    models = []
    for seed in range(3):
        module, params = layernorm_to_rmsnorm(*create_model("gpt2", seed=seed, context=4, **kwargs))
        models.append(params)
    spec = module.symmetry_spec()
    seen = torch.arange(17) < 9
    masks = {"transformer.wte.weight": seen, "lm_head.weight": seen}
    noisy = [_noisy_unseen_rows(p, seen, k) for k, p in enumerate(models)]
    config = UniverseConfig(max_iter=3)
    clean = _universe(spec, models, config, row_masks=masks)
    dirty = _universe(spec, noisy, config, row_masks=masks)
    unmasked = _universe(spec, noisy, config)
    for k in range(3):
        torch.testing.assert_close(
            clean.transforms[k]["residual"], dirty.transforms[k]["residual"], atol=1e-4, rtol=0
        )
    assert not all(
        torch.allclose(
            clean.transforms[k]["residual"], unmasked.transforms[k]["residual"], atol=1e-2
        )
        for k in range(1, 3)
    )
