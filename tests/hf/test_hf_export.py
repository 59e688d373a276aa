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
