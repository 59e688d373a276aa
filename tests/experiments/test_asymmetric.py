"""W-asymmetric and syre models: fixed parts, folding to the plain zoo model, training."""

from __future__ import annotations

import pytest
import torch
from tests.tiny_models import TINY

from lmckit.data import Dataset
from lmckit.experiments._identifiability._asymmetric import (
    asym_parts,
    create_asym_model,
    list_asym_models,
    to_plain,
)
from lmckit.models import list_models
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import apply
from lmckit.training._train import TrainConfig, fit

MLP_KWARGS = {"in_features": 12, "hidden": [8, 8], "out_features": 3, "norm": "layer"}
RESNET_KWARGS = {"in_channels": 1, "num_classes": 3, "width_mult": 1, "norm": "layer"}
VIT_BLOCK_LAYERS = (
    "attention.attention.query",
    "attention.attention.key",
    "attention.attention.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)


@pytest.mark.parametrize("mode", ["wasym", "syre"])
@pytest.mark.parametrize(
    ("name", "kwargs", "shape"),
    [
        ("asym_mlp", MLP_KWARGS, (5, 12)),
        ("asym_resnet20", RESNET_KWARGS, (2, 1, 8, 8)),
        ("asym_vit", TINY["vit"], (4, 1, 8, 8)),
    ],
)
def test_to_plain_computes_the_same_function(outputs, name, kwargs, shape, mode) -> None:
    module, params = create_asym_model(name, seed=1, kappa=2.0, num_fixed=3, mode=mode, **kwargs)
    plain, folded = to_plain(module, params)
    assert type(plain).__name__ in ("MLP", "ResNet20", "ViT")
    assert folded.keys() == plain.state_dict().keys()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        outputs(module, params, x), outputs(plain, folded, x), rtol=0, atol=1e-5
    )
    # the route to the aligners: the plain spec acts on folded params exactly
    spec = plain.symmetry_spec()
    spec.validate(folded)
    moved = apply(spec, folded, random_transform(spec, seed=3))
    torch.testing.assert_close(
        outputs(plain, moved, x), outputs(plain, folded, x), rtol=1e-4, atol=1e-5
    )


def test_wasym_mask_and_offset() -> None:
    kappa, num_fixed = 1.5, 4
    module, params = create_asym_model(
        "asym_mlp", seed=0, kappa=kappa, num_fixed=num_fixed, **MLP_KWARGS
    )
    for layer in module.asym_layers:
        mask, offset = params[f"{layer}.mask"], params[f"{layer}.offset"]
        assert set(mask.unique().tolist()) <= {0.0, 1.0}
        assert torch.all((1 - mask).sum(1) == num_fixed)  # num_fixed per neuron
        assert torch.all(offset[mask == 1] == 0)
        assert torch.all(params[f"{layer}.weight"][mask == 0] == 0)
        # fixed entries are kappa * F with F standard normal: rescaling kappa rescales them
    _, other = create_asym_model("asym_mlp", seed=0, kappa=2 * kappa, num_fixed=4, **MLP_KWARGS)
    torch.testing.assert_close(other["layers.0.offset"], 2 * params["layers.0.offset"])


def test_fixed_parts_are_shared_across_seeds_and_set_by_their_seeds() -> None:
    _, a = create_asym_model("asym_mlp", seed=0, kappa=1.0, num_fixed=3, **MLP_KWARGS)
    _, b = create_asym_model("asym_mlp", seed=1, kappa=1.0, num_fixed=3, **MLP_KWARGS)
    assert torch.equal(a["layers.1.mask"], b["layers.1.mask"])
    assert torch.equal(a["layers.1.offset"], b["layers.1.offset"])
    assert not torch.equal(a["layers.1.weight"], b["layers.1.weight"])
    _, c = create_asym_model("asym_mlp", seed=0, kappa=1.0, num_fixed=3, mask_seed=5, **MLP_KWARGS)
    assert not torch.equal(a["layers.1.mask"], c["layers.1.mask"])
    # layers draw different masks from one seed
    assert not torch.equal(a["layers.0.mask"][:, :8], a["layers.1.mask"])


def test_syre_has_no_mask_and_a_dense_offset() -> None:
    mask, offset = asym_parts(
        (6, 5), kappa=0.5, num_fixed=0, mode="syre", mask_seed=0, fixed_seed=2, layer=0
    )
    assert torch.all(mask == 1)
    fixed = asym_parts(
        (6, 5), kappa=1.0, num_fixed=0, mode="syre", mask_seed=0, fixed_seed=2, layer=0
    )[1]
    torch.testing.assert_close(offset, 0.5 * fixed)
    assert torch.all(offset != 0)


def test_training_never_moves_fixed_entries() -> None:
    module, init = create_asym_model("asym_mlp", seed=0, kappa=1.0, num_fixed=5, **MLP_KWARGS)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 12, generator=gen)
    y = torch.randint(0, 3, (64,), generator=gen)
    data = Dataset("toy", x, y, x[:16], y[:16], num_classes=3)
    config = TrainConfig(epochs=3, batch_size=16, optimizer="adamw", lr=1e-2, weight_decay=0.1)
    trained = fit(module, init, data, config, seed=0, progress=False).params
    for layer in module.asym_layers:
        mask = init[f"{layer}.mask"]
        assert torch.equal(trained[f"{layer}.mask"], mask)
        assert torch.equal(trained[f"{layer}.offset"], init[f"{layer}.offset"])
        effective = mask * trained[f"{layer}.weight"] + trained[f"{layer}.offset"]
        start = mask * init[f"{layer}.weight"] + init[f"{layer}.offset"]
        assert torch.equal(effective[mask == 0], start[mask == 0])  # frozen at kappa * F
        assert not torch.equal(effective[mask == 1], start[mask == 1])  # the rest trained


def test_folding_commutes_with_interpolation() -> None:
    module, a = create_asym_model("asym_mlp", seed=0, kappa=1.0, num_fixed=3, **MLP_KWARGS)
    _, b = create_asym_model("asym_mlp", seed=1, kappa=1.0, num_fixed=3, **MLP_KWARGS)
    _, folded_mid = to_plain(module, interpolate(a, b, 0.3))
    mid_folded = interpolate(to_plain(module, a)[1], to_plain(module, b)[1], 0.3)
    for key in folded_mid:
        torch.testing.assert_close(folded_mid[key], mid_folded[key])


def test_asymmetric_models_stay_out_of_the_zoo_registry() -> None:
    assert list_asym_models() == ["asym_mlp", "asym_resnet20", "asym_vit"]
    assert not set(list_asym_models()) & set(list_models())
    module, _ = create_asym_model("asym_mlp", **MLP_KWARGS)
    with pytest.raises(ValueError, match="to_plain"):
        module.symmetry_spec()


def test_num_fixed_per_layer_and_default() -> None:
    module, params = create_asym_model("asym_mlp", num_fixed=[1, 2, 3], **MLP_KWARGS)
    assert [int((1 - params[f"{n}.mask"][0]).sum()) for n in module.asym_layers] == [1, 2, 3]
    module, params = create_asym_model("asym_mlp", **MLP_KWARGS)  # an eighth, at least one
    assert [int((1 - params[f"{n}.mask"][0]).sum()) for n in module.asym_layers] == [1, 1, 1]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "dense"}, "mode"),
        ({"kappa": -1.0}, "kappa"),
        ({"num_fixed": 13}, "num_fixed"),
        ({"num_fixed": [1, 2]}, "num_fixed"),
    ],
)
def test_bad_arguments_raise(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        create_asym_model("asym_mlp", **MLP_KWARGS, **kwargs)


def test_unknown_name_and_wrong_module() -> None:
    with pytest.raises(KeyError, match="asym_mlp"):
        create_asym_model("asym_gpt2")
    from lmckit.models import create_model

    plain, params = create_model("mlp", **MLP_KWARGS)
    with pytest.raises(ValueError, match="asymmetric"):
        to_plain(plain, params)


def test_asym_vit_breaks_exactly_the_block_projections() -> None:
    module, params = create_asym_model("asym_vit", kappa=1.0, num_fixed=2, **TINY["vit"])
    want = [
        f"vit.encoder.layer.{i}.{part}"
        for i in range(TINY["vit"]["depth"])
        for part in VIT_BLOCK_LAYERS
    ]
    assert module.asym_layers == want
    for layer in want:
        assert torch.all((1 - params[f"{layer}.mask"]).sum(1) == 2)
    # patch embedding and classifier stay plain: no fixed parts
    assert not any(k.startswith(("classifier.", "vit.embeddings.")) and "mask" in k for k in params)
    # each layer draws its own mask (the three width x width projections differ)
    att = "vit.encoder.layer.0.attention.attention"
    assert not torch.equal(params[f"{att}.query.mask"], params[f"{att}.key.mask"])


def test_asym_vit_breaks_the_plain_symmetries(outputs) -> None:
    """A random plain-ViT transform keeps the folded function but not the asym one.

    Moving the trainable ``W`` (and the untouched plain parts) by a transform of the plain
    spec while the fixed ``C`` stays put changes the function: the fixed parts pin
    the frame.
    """
    module, params = create_asym_model("asym_vit", seed=0, kappa=1.0, num_fixed=3, **TINY["vit"])
    plain, folded = to_plain(module, params)
    spec = plain.symmetry_spec()
    transform = random_transform(spec, seed=4)
    trainable = {k: v for k, v in params.items() if not k.endswith((".mask", ".offset"))}
    moved = {**params, **apply(spec, trainable, transform)}
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    moved_folded = apply(spec, folded, transform)
    torch.testing.assert_close(
        outputs(plain, moved_folded, x), outputs(plain, folded, x), rtol=1e-4, atol=1e-5
    )
    gap = (outputs(module, moved, x) - outputs(module, params, x)).abs().max()
    assert gap > 1e-2


@pytest.mark.parametrize("mode", ["wasym", "syre"])
def test_asym_vit_fixed_entries_get_no_gradient(mode) -> None:
    module, params = create_asym_model(
        "asym_vit", seed=0, kappa=1.0, num_fixed=3, mode=mode, **TINY["vit"]
    )
    module.load_state_dict(params)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 1, 8, 8, generator=gen)
    y = torch.randint(0, 3, (8,), generator=gen)
    torch.nn.functional.cross_entropy(module(x), y).backward()
    buffers = dict(module.named_buffers())
    for name, p in module.named_parameters():
        assert p.grad is not None
        owner, _, leaf = name.rpartition(".")
        if owner in module.asym_layers and leaf == "weight":
            mask = buffers[f"{owner}.mask"]
            assert torch.all(p.grad[mask == 0] == 0)  # fixed entries: exactly zero
            assert p.grad[mask == 1].abs().max() > 0  # the rest learns
    assert not any(b.requires_grad for b in buffers.values())


def test_asym_vit_training_step_keeps_fixed_entries() -> None:
    module, init = create_asym_model("asym_vit", seed=0, kappa=1.0, num_fixed=3, **TINY["vit"])
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 1, 8, 8, generator=gen)
    y = torch.randint(0, 3, (32,), generator=gen)
    data = Dataset("toy", x, y, x[:8], y[:8], num_classes=3)
    config = TrainConfig(epochs=1, batch_size=16, optimizer="adamw", lr=1e-2, weight_decay=0.1)
    trained = fit(module, init, data, config, seed=0, progress=False).params
    for layer in module.asym_layers:
        mask = init[f"{layer}.mask"]
        effective = to_plain(module, trained)[1][f"{layer}.weight"]
        start = to_plain(module, init)[1][f"{layer}.weight"]
        assert torch.equal(effective[mask == 0], start[mask == 0])
        assert not torch.equal(effective[mask == 1], start[mask == 1])


def test_asym_vit_runs_share_fixed_parts() -> None:
    kwargs = {"kappa": 1.0, "num_fixed": 3, "mask_seed": 2, "fixed_seed": 5, **TINY["vit"]}
    module, a = create_asym_model("asym_vit", seed=0, **kwargs)
    _, b = create_asym_model("asym_vit", seed=1, **kwargs)
    for layer in module.asym_layers:
        assert torch.equal(a[f"{layer}.mask"], b[f"{layer}.mask"])
        assert torch.equal(a[f"{layer}.offset"], b[f"{layer}.offset"])
        assert not torch.equal(a[f"{layer}.weight"], b[f"{layer}.weight"])
    _, c = create_asym_model("asym_vit", seed=0, **{**kwargs, "fixed_seed": 6})
    layer = module.asym_layers[0]
    assert torch.equal(a[f"{layer}.mask"], c[f"{layer}.mask"])
    assert not torch.equal(a[f"{layer}.offset"], c[f"{layer}.offset"])
