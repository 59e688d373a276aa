"""example_inputs are valid for the model, and torch.export traces every family with them."""

from __future__ import annotations

import torch

from lmckit.hf import example_inputs, load_hf


def test_example_inputs_fit_the_config(hf_folder, family: str) -> None:
    model = load_hf(hf_folder(family))
    config = model.module.config
    (x,) = example_inputs(model, batch=3, length=5, seed=1)
    if family == "vit":
        assert x.shape == (3, config.num_channels, config.image_size, config.image_size)
        assert x.dtype == torch.float32
    else:
        assert x.shape == (3, 5) and x.dtype == torch.int64
        assert 0 <= int(x.min()) and int(x.max()) < config.vocab_size
    # seeded: the same seed gives the same inputs, another seed others
    assert torch.equal(x, example_inputs(model, batch=3, length=5, seed=1)[0])
    assert not torch.equal(x, example_inputs(model, batch=3, length=5, seed=2)[0])


def test_length_is_capped_by_the_positions(hf_folder) -> None:
    model = load_hf(hf_folder("bert"))  # 16 positions
    assert example_inputs(model, length=100)[0].shape == (2, 16)


def test_export_traces_every_family(hf_folder, family: str) -> None:
    model = load_hf(hf_folder(family))
    inputs = example_inputs(model)
    program = torch.export.export(model.module, inputs, strict=False)
    with torch.no_grad():
        expected = model.module(*inputs).logits
        got = program.module()(*inputs).logits
    assert torch.equal(got, expected)
    # the traced graph takes every weight of params as an input under its name; the
    # others it lifts are tied aliases (lm_head.weight) and non-persistent buffers
    sig = program.graph_signature
    lifted = set(sig.parameters) | set(sig.buffers)
    assert set(model.params) <= lifted
    assert lifted - set(model.params) == set(model.module.all_tied_weights_keys) | set(
        sig.non_persistent_buffers
    )


def test_a_mask_token_is_put_on_the_traced_path_by_an_all_false_mask(hf_folder) -> None:
    from lmckit.forms._recipe import default_inputs
    from lmckit.inference import analyze_symmetries

    model = load_hf(hf_folder("dinov2"))  # its embeddings read mask_token at masked patches
    inputs = default_inputs(model.module)
    assert isinstance(inputs, dict) and set(inputs) == {"pixel_values", "bool_masked_pos"}
    mask = inputs["bool_masked_pos"]
    assert mask.dtype == torch.bool and mask.shape == (2, 16) and not mask.any()  # 4x4 patches
    (plain,) = example_inputs(model)
    assert torch.equal(inputs["pixel_values"], plain)
    with torch.no_grad():
        assert torch.equal(model.module(**inputs).logits, model.module(plain).logits)
    token = "dinov2.embeddings.mask_token"
    without = analyze_symmetries(model.module, (plain,))
    assert f"{token}: read by no traced op on the example inputs, so it is in no space" in (
        without.left_out
    )
    spaces = [s.name for s in analyze_symmetries(model.module, inputs).spec
              if any(u.param == token for u in s.uses)]  # fmt: skip
    assert spaces == ["residual"]
    # a model without a mask token gets no mask
    assert isinstance(default_inputs(load_hf(hf_folder("vit")).module), tuple)
