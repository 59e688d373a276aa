"""Property tests of the symmetry algebra through the public API, on random zoo models.

For a random architecture (kind, sizes and norm drawn from a seed) and random group
elements ``S``, ``T`` of its spec: ``apply`` by the identity changes nothing,
``apply(T)`` then ``apply(T^-1)`` gives the parameters back, ``apply(S)`` after
``apply(T)`` equals ``apply(S o T)``, the network's function is unchanged, and the
input parameters are never modified.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.func import functional_call

import lmckit
from lmckit.models import create_model
from lmckit.symmetry._transform import Transform

SEEDS = range(16)


def _random_model(seed: int):
    """A small zoo model drawn from ``seed``, its parameters and a matching input batch."""
    rng = random.Random(seed)
    kind = ["mlp", "mlp", "vgg", "gpt2", "vit", "resnet20"][seed % 6]
    gen = torch.Generator().manual_seed(seed)
    if kind == "mlp":
        hidden = [rng.randint(1, 12) for _ in range(rng.randint(1, 3))]
        kwargs = {"in_features": 5, "hidden": hidden, "out_features": rng.randint(1, 4),
                  "norm": rng.choice(["none", "batch", "layer"]),
                  "activation": rng.choice(["relu", "gelu"])}  # fmt: skip
        x = torch.randn(4, 5, generator=gen)
    elif kind == "vgg":
        widths = [rng.randint(2, 6), "M", rng.randint(2, 6)]
        kwargs = {"in_channels": 2, "num_classes": 3, "image_size": 4, "widths": widths,
                  "norm": rng.choice(["batch", "layer", "group", "none"])}  # fmt: skip
        if kwargs["norm"] == "group":
            kwargs["widths"] = [4, "M", 6]
        x = torch.randn(3, 2, 4, 4, generator=gen)
    elif kind == "resnet20":
        kwargs = {"in_channels": 1, "num_classes": 3, "norm": rng.choice(["batch", "layer"])}
        x = torch.randn(2, 1, 6, 6, generator=gen)
    elif kind == "gpt2":
        heads = rng.choice([1, 2])
        kwargs = {"vocab_size": rng.randint(3, 11), "n_layer": rng.randint(1, 2), "n_head": heads,
                  "n_embd": 4 * heads, "n_inner": rng.randint(2, 9), "context": 6,
                  "norm": rng.choice(["layer", "rms"])}  # fmt: skip
        x = torch.randint(0, kwargs["vocab_size"], (2, 6), generator=gen)
    else:
        heads = rng.choice([1, 2])
        kwargs = {"image_size": 4, "patch_size": 2, "in_channels": 1, "num_classes": 3,
                  "width": 4 * heads, "depth": rng.randint(1, 2), "heads": heads,
                  "mlp_dim": rng.randint(2, 9), "norm": rng.choice(["layer", "rms"])}  # fmt: skip
        x = torch.randn(2, 1, 4, 4, generator=gen)
    model, params = create_model(kind, seed=seed, **kwargs)
    model.eval()
    if any("running_var" in k for k in params):
        # non-trivial BatchNorm statistics, so that transforming them matters
        params = {k: (v.uniform_(0.5, 2.0) if "running_var" in k else v) for k, v in
                  ((k, v.clone()) for k, v in params.items())}  # fmt: skip
    return model, params, x


def _close(p: dict, q: dict, atol: float = 1e-5) -> None:
    assert p.keys() == q.keys()
    for k in p:
        torch.testing.assert_close(p[k], q[k], atol=atol, rtol=1e-5, msg=k)


@pytest.mark.parametrize("seed", SEEDS)
def test_apply_compose_inverse_laws_and_function(seed: int) -> None:
    model, params, x = _random_model(seed)
    frozen = {k: v.clone() for k, v in params.items()}
    spec = model.symmetry_spec()
    s, t = lmckit.random_transform(spec, 2 * seed), lmckit.random_transform(spec, 2 * seed + 1)
    moved = lmckit.apply(spec, params, t)
    # identity
    _close(lmckit.apply(spec, params, Transform.identity(spec)), params, atol=0)
    # inverse
    _close(lmckit.apply(spec, moved, t.inverse()), params, atol=1e-4)
    # composition: apply(S) after apply(T) == apply(S o T)
    _close(lmckit.apply(spec, moved, s), lmckit.apply(spec, params, s.compose(t)), atol=1e-4)
    # the function is unchanged
    with torch.no_grad():
        before = functional_call(model, params, (x,))
        after = functional_call(model, moved, (x,))
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
    # a non-trivial transform moves some parameter, and the input was not modified
    assert any(not torch.equal(moved[k], params[k]) for k in params) or all(
        s_.n == 1 for s_ in spec
    )
    _close(params, frozen, atol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_inverse_of_composition_reverses_the_order(seed: int) -> None:
    model, params, _ = _random_model(seed)
    spec = model.symmetry_spec()
    s, t = lmckit.random_transform(spec, seed + 100), lmckit.random_transform(spec, seed + 200)
    lhs = lmckit.apply(spec, params, s.compose(t).inverse())
    rhs = lmckit.apply(spec, params, t.inverse().compose(s.inverse()))
    _close(lhs, rhs, atol=1e-4)
