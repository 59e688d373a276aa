"""GPT-2 and ViT zoo models: layout, names, causality, specs (invariance is in test_zoo)."""

from __future__ import annotations

import pytest
import torch
from tests.tiny_models import TINY
from torch.func import functional_call

from lmckit.models import create_model
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import HeadPermutation, Nest, Orthogonal, Permutation, apply


def _tokens(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["gpt2"]["vocab_size"], (3, TINY["gpt2"]["context"]), generator=gen)


def test_gpt2_uses_hugging_face_names() -> None:
    _, params = create_model("gpt2", tie_embeddings=False, **TINY["gpt2"])
    for key in (
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.h.1.ln_1.weight",
        "transformer.h.1.attn.c_attn.weight",
        "transformer.h.1.attn.c_proj.bias",
        "transformer.h.1.ln_2.bias",
        "transformer.h.1.mlp.c_fc.weight",
        "transformer.h.1.mlp.c_proj.weight",
        "transformer.ln_f.weight",
        "lm_head.weight",
    ):
        assert key in params, key
    assert params["transformer.h.0.attn.c_attn.weight"].shape == (3 * 8, 8)  # fused q, k, v
    assert params["transformer.h.0.mlp.c_fc.weight"].shape == (12, 8)


def test_gpt2_tied_head_is_the_embedding() -> None:
    module, params = create_model("gpt2", **TINY["gpt2"])
    assert "lm_head.weight" not in params
    x = _tokens()
    logits = functional_call(module.eval(), params, (x,))
    assert logits.shape == (3, TINY["gpt2"]["context"], TINY["gpt2"]["vocab_size"])
    hidden = {}
    module.transformer.ln_f.register_forward_hook(lambda _m, _i, out: hidden.update(h=out))
    functional_call(module, params, (x,))
    want = hidden["h"] @ params["transformer.wte.weight"].T
    torch.testing.assert_close(logits, want)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_gpt2_is_causal(norm: str) -> None:
    module, params = create_model("gpt2", norm=norm, **TINY["gpt2"])
    x = _tokens()
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % TINY["gpt2"]["vocab_size"]
    a, b = (functional_call(module.eval(), params, (t,)) for t in (x, y))
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_gpt2_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="multiple of n_head"):
        create_model("gpt2", vocab_size=5, n_embd=10, n_head=4)
    with pytest.raises(ValueError, match="norm"):
        create_model("gpt2", vocab_size=5, n_embd=8, n_head=2, norm="batch")
    with pytest.raises(ValueError, match="tied"):
        create_model("gpt2", vocab_size=5, n_embd=8, n_head=2, lm_head_bias=True)
    module, params = create_model("gpt2", **TINY["gpt2"])
    with pytest.raises(ValueError, match="time"):
        functional_call(module, params, (torch.zeros(1, 8, dtype=torch.long),))


def test_vit_uses_hugging_face_names_and_classifies() -> None:
    module, params = create_model("vit", **TINY["vit"])
    pre = "vit.encoder.layer.1"
    for key in (
        "vit.embeddings.cls_token",
        "vit.embeddings.position_embeddings",
        "vit.embeddings.patch_embeddings.projection.weight",
        f"{pre}.layernorm_before.weight",
        f"{pre}.attention.attention.query.weight",
        f"{pre}.attention.attention.key.bias",
        f"{pre}.attention.attention.value.weight",
        f"{pre}.attention.output.dense.weight",
        f"{pre}.layernorm_after.bias",
        f"{pre}.intermediate.dense.weight",
        f"{pre}.output.dense.weight",
        "vit.layernorm.weight",
        "classifier.weight",
    ):
        assert key in params, key
    assert params["vit.embeddings.position_embeddings"].shape == (1, 4 + 1, 8)
    out = functional_call(module.eval(), params, (torch.randn(2, 1, 8, 8),))
    assert out.shape == (2, 3)


def test_vit_mean_pooling_has_no_class_token_and_keeps_its_symmetry() -> None:
    module, params = create_model("vit", class_token=False, norm="rms", **TINY["vit"])
    assert "vit.embeddings.cls_token" not in params
    assert params["vit.embeddings.position_embeddings"].shape == (1, 4, 8)
    spec = module.symmetry_spec()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    moved = apply(spec, params, random_transform(spec, 3))
    a, b = (functional_call(module.eval(), p, (x,)) for p in (params, moved))
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_vit_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="multiple of patch"):
        create_model("vit", **{**TINY["vit"], "patch_size": 3})
    with pytest.raises(ValueError, match="heads"):
        create_model("vit", **{**TINY["vit"], "heads": 3})


@pytest.mark.parametrize("name", ["gpt2", "vit"])
@pytest.mark.parametrize(("norm", "group"), [("layer", Permutation), ("rms", Orthogonal)])
def test_spec_layout(name: str, norm: str, group: type) -> None:
    kwargs = TINY[name]
    module, params = create_model(name, norm=norm, **kwargs)
    spec = module.symmetry_spec()
    spec.validate(params)
    outer = tuple(s.name for s in spec if s.nest is None)
    assert outer == ("residual", "heads.0", "ffn.0", "heads.1", "ffn.1")
    # inside each head, nested in the head permutation: orthogonal bases of its
    # queries/keys and of its values (GPT-2's fused projection too: its query, key and
    # value chunks are blocks with units of their own)
    kinds = ("qk", "value")
    inner = {s.name: (s.nest, s.group, s.n) for s in spec if s.nest is not None}
    assert inner == {
        f"heads.{i}.{kind}.{h}": (Nest(f"heads.{i}", h, kind), Orthogonal(), 4)
        for i in range(2)
        for kind in kinds
        for h in range(2)
    }
    assert isinstance(spec["residual"].group, group)
    heads = spec["heads.1"]
    assert heads.group == HeadPermutation(2, 4)
    assert heads.circuits is not None
    assert spec["ffn.0"].n == 12
    # an RMSNorm model has no elementwise parameter on the residual stream
    roles = {u.role for u in spec["residual"].uses}
    assert ("elementwise" in roles) == (norm == "layer")
