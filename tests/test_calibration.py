"""Temperature calibration recovers known temperatures and never hurts the fitted loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmckit.data import batches
from lmckit.merging._calibration import (
    calibrate,
    calibrated_metrics,
    collect_logits,
    evaluate_path_calibrated,
    fit_inverse_temperature,
)
from lmckit.models import create_model


def _sampled(scale: float, n: int = 20000, seed: int = 0):
    """Labels drawn from softmax(z); the model reports ``scale * z`` (so beta* = 1/scale)."""
    gen = torch.Generator().manual_seed(seed)
    z = 2.0 * torch.randn(n, 5, generator=gen)
    y = torch.multinomial(F.softmax(z, -1), 1, generator=gen).squeeze(1)
    return scale * z, y


@pytest.mark.parametrize("scale", [0.25, 1.0, 3.0])
def test_recovers_the_inverse_of_a_known_temperature(scale):
    logits, y = _sampled(scale)
    beta = fit_inverse_temperature(logits, y)
    assert beta * scale == pytest.approx(1.0, rel=0.05)


def test_fitted_beta_is_the_minimum_and_keeps_accuracy():
    logits, y = _sampled(2.0, n=3000)
    beta = fit_inverse_temperature(logits, y)
    best = calibrated_metrics(logits, y, beta)
    for other in (0.9 * beta, 1.1 * beta, 1.0):
        assert best.loss <= calibrated_metrics(logits, y, other).loss + 1e-9
    assert best.acc == calibrated_metrics(logits, y, 1.0).acc


def test_bad_inputs():
    logits, y = _sampled(1.0, n=10)
    with pytest.raises(ValueError):
        calibrated_metrics(logits, y, 0.0)
    with pytest.raises(ValueError):
        fit_inverse_temperature(logits, y[:5])


def test_calibrate_on_a_model_and_along_a_constant_path():
    model, params = create_model("mlp", seed=0, in_features=4, hidden=[8], out_features=3)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 4, generator=gen), torch.randint(0, 3, (200,), generator=gen)
    logits, targets = collect_logits(model, params, batches(x, y, 64))
    assert logits.shape == (200, 3) and torch.equal(targets, y)
    result = calibrate(model, params, batches(x, y, 64), batches(x, y, 64))
    assert result.after.loss <= result.before.loss + 1e-9  # fitted and scored on the same data
    assert result.after.acc == result.before.acc
    path = evaluate_path_calibrated(
        model, params, params, lambda: batches(x, y, 64), lambda: batches(x, y, 64), points=3
    )
    assert path.loss == pytest.approx([result.after.loss] * 3)
    assert path.barrier_loss == pytest.approx(0.0, abs=1e-9)
    assert len(path.meta["inverse_temperature"]) == 3
