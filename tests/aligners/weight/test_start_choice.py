"""Weight matching's ``start="best"``: both starts, the midpoint's training loss decides."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.aligners._weight.start_choice import StartChoice, midpoint_loss
from lmckit.data import Dataset, batches
from lmckit.measure._evaluate import evaluate
from lmckit.models import create_model
from lmckit.training._train import TrainConfig, fit


@pytest.fixture(scope="module")
def deep_pair(digits: Dataset):
    """Four hidden layers of 32: here the identity start's midpoint is the better one."""
    trained = []
    for seed in (0, 1):
        model, init = create_model(
            "mlp", seed=seed, in_features=64, hidden=[32] * 4, out_features=10, norm="none"
        )
        config = TrainConfig(epochs=6, batch_size=64, lr=3e-3)
        trained.append(fit(model, init, digits, config, seed=seed, progress=False).params)
    return model, trained[0], trained[1]


@pytest.mark.parametrize("which", ["mlp_pair", "deep_pair"])
def test_best_keeps_the_start_whose_midpoint_has_the_lower_training_loss(
    which, request, digits
) -> None:
    if which == "mlp_pair":
        model, a, b = request.getfixturevalue("mlp_pair")[:3]
    else:
        model, a, b = request.getfixturevalue("deep_pair")
    spec = model.symmetry_spec()
    single = {
        s: weight_matching(spec, a, b, WeightMatchingConfig(start=s))
        for s in ("anchored", "identity")
    }
    losses = {s: midpoint_loss(model, a, r.apply(b), digits) for s, r in single.items()}
    assert abs(losses["anchored"] - losses["identity"]) > 1e-3  # the choice matters here
    best = weight_matching(spec, a, b, WeightMatchingConfig(start="best"), model=model, data=digits)
    assert isinstance(best, StartChoice)
    want = min(losses, key=losses.__getitem__)
    assert best.start == want
    assert best.midpoint_losses == pytest.approx(losses)
    moved, expected = best.apply(b), single[want].apply(b)
    assert all(torch.equal(moved[k], expected[k]) for k in b)


def test_the_two_fixture_pairs_pick_different_starts(mlp_pair, deep_pair, digits) -> None:
    # together the two pairs above exercise both outcomes
    picks = set()
    for model, a, b in (mlp_pair[:3], deep_pair):
        config = WeightMatchingConfig(start="best")
        picks.add(
            weight_matching(model.symmetry_spec(), a, b, config, model=model, data=digits).start
        )
    assert picks == {"anchored", "identity"}


def test_best_without_data_is_one_clear_error(mlp_pair) -> None:
    model, a, b, _ = mlp_pair
    with pytest.raises(ValueError, match=r"start='best' compares .* give model= and data="):
        weight_matching(
            model.symmetry_spec(), a, b, WeightMatchingConfig(start="best"), model=model
        )


def test_midpoint_loss_reads_a_fixed_training_sample_only(mlp_pair, digits) -> None:
    model, a, b, _ = mlp_pair
    # the midpoint of a model with itself is the model: its loss on the whole training split
    whole = evaluate(model, a, batches(digits.x_train, digits.y_train, 64)).loss
    n = digits.x_train.shape[0]
    assert midpoint_loss(model, a, a, digits, targets=n + 5) == pytest.approx(whole)
    # the test split plays no part; the same seed gives the same sample
    broken = dataclasses.replace(digits, x_test=digits.x_test * float("nan"))
    first = midpoint_loss(model, a, b, digits, targets=100, seed=3)
    assert midpoint_loss(model, a, b, broken, targets=100, seed=3) == first
    assert midpoint_loss(model, a, b, digits, targets=100, seed=4) != first


def test_language_model_samples_count_tokens() -> None:
    # 12 blocks of 8 tokens, sampled whole: 90 targets still need all 12 blocks, 81 need 11
    model, params = create_model("gpt2", seed=0, vocab_size=20, n_layer=1, n_head=2, n_embd=8,
                                 context=8)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 20, (12, 8), generator=gen)
    data = Dataset("lm", x, torch.roll(x, -1, 1), x[:2], x[:2], 20)
    whole = evaluate(model, params, batches(x, torch.roll(x, -1, 1), 64)).loss
    assert midpoint_loss(model, params, params, data, targets=96) == pytest.approx(whole)
    assert midpoint_loss(model, params, params, data, targets=90) == pytest.approx(whole)
    assert midpoint_loss(model, params, params, data, targets=81) != pytest.approx(whole)


def test_batchnorm_statistics_of_the_midpoint_are_recomputed(bn_mlp_pair, digits) -> None:
    model, a, b, _ = bn_mlp_pair
    loss = midpoint_loss(model, a, b, digits, targets=500)

    def wrong_stats(p):  # running statistics that no data produced
        return {k: v * 7.0 if "running" in k else v for k, v in p.items()}

    assert midpoint_loss(model, wrong_stats(a), wrong_stats(b), digits, targets=500) == (
        pytest.approx(loss)
    )
