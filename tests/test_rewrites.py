"""Rewrites keep every logit: LayerNorm -> RMSNorm, orthogonal maps, wider embeddings,
heads as QK/OV circuits."""

from __future__ import annotations

import pytest
import torch
from tests.tiny_models import TINY
from torch import Tensor

from lmckit.forms._rewrites import heads_to_circuits, layernorm_to_rmsnorm
from lmckit.forms._widen import embed_in_wider
from lmckit.models import ZooModel, create_model
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import Orthogonal, Space, SymmetrySpec, Transform, apply

VARIANTS = [
    ("gpt2", {}),
    ("gpt2", {"tie_embeddings": False}),
    ("vit", {}),
    ("vit", {"class_token": False}),
]


def _model(name: str, extra: dict, seed: int = 0) -> tuple[ZooModel, Params, Tensor]:
    module, params = create_model(name, seed=seed, **TINY[name], **extra)
    module.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    # non-trivial norms: scales around 1, biases around 0
    for key, value in list(params.items()):
        if ".ln" in key or "layernorm" in key:
            base = 1.0 if key.endswith("weight") else 0.0
            params[key] = base + 0.5 * torch.randn(value.shape, generator=gen)
        elif key.endswith("bias") or "cls_token" in key:
            params[key] = 0.1 * torch.randn(value.shape, generator=gen)
    if name == "gpt2":
        gpt2 = TINY["gpt2"]
        x = torch.randint(0, gpt2["vocab_size"], (4, gpt2["context"]), generator=gen)
    else:
        x = torch.randn(4, 1, 8, 8, generator=gen)
    return module, params, x


def _rel_err(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


@pytest.mark.parametrize(("name", "extra"), VARIANTS)
def test_layernorm_to_rmsnorm_keeps_logits(outputs, name: str, extra: dict) -> None:
    module, params, x = _model(name, extra)
    before = {k: v.clone() for k, v in params.items()}
    rms, rms_params = layernorm_to_rmsnorm(module, params)
    assert type(rms) is type(module) and rms.norm == "rms"
    assert isinstance(rms.symmetry_spec()["residual"].group, Orthogonal)
    rms.symmetry_spec().validate(rms_params)
    assert not any("ln_" in k or "layernorm" in k for k in rms_params)
    assert _rel_err(outputs(module, params, x), outputs(rms, rms_params, x)) <= 1e-4
    assert all(torch.equal(before[k], params[k]) for k in params)  # inputs untouched


@pytest.mark.parametrize(("name", "extra"), VARIANTS)
def test_orthogonal_residual_maps_keep_logits_after_the_rewrite(
    outputs, name: str, extra: dict
) -> None:
    module, params, x = _model(name, extra)
    rms, rms_params = layernorm_to_rmsnorm(module, params)
    spec = rms.symmetry_spec()
    want = outputs(module, params, x)
    for seed in range(3):
        moved = apply(spec, rms_params, random_transform(spec, seed))
        assert _rel_err(want, outputs(rms, moved, x)) <= 1e-4


@pytest.mark.parametrize(("name", "extra"), VARIANTS)
def test_orthogonal_map_breaks_layernorm(outputs, name: str, extra: dict) -> None:
    """Negative control: without the rewrite, a rotation of the residual stream is not exact."""
    module, params, x = _model(name, extra)
    spec = module.symmetry_spec()
    rotation = random_transform(spec.with_groups(residual=Orthogonal()), 0)["residual"]
    residual = spec["residual"]
    uses = tuple(u for u in residual.uses if u.role != "elementwise")
    rotate = SymmetrySpec((Space("residual", residual.n, Orthogonal(), uses),))
    moved = apply(rotate, params, Transform(rotate, {"residual": rotation}))
    assert _rel_err(outputs(module, params, x), outputs(module, moved, x)) > 1e-3


@pytest.mark.parametrize(("name", "extra"), VARIANTS)
@pytest.mark.parametrize("width", [8, 12, 16])
def test_embed_in_wider_keeps_logits(outputs, name: str, extra: dict, width: int) -> None:
    module, params, x = _model(name, extra)
    rms, rms_params = layernorm_to_rmsnorm(module, params)
    wide, wide_params = embed_in_wider(rms, rms_params, width, rotation=3)
    spec = wide.symmetry_spec()
    spec.validate(wide_params)
    assert spec["residual"].n == width
    assert spec["heads.0"].n == width and spec["ffn.0"].n == 12 * width // 8
    assert _rel_err(outputs(module, params, x), outputs(wide, wide_params, x)) <= 1e-4


def test_embed_in_wider_takes_a_given_rotation_and_checks_it(outputs) -> None:
    module, params, x = _model("gpt2", {"tie_embeddings": False})
    rms, rms_params = layernorm_to_rmsnorm(module, params)
    rotation = Orthogonal().random(8, torch.Generator().manual_seed(0), m=10)
    wide, wide_params = embed_in_wider(rms, rms_params, 10, inner=20, rotation=rotation)
    emb = wide_params["transformer.wte.weight"]
    torch.testing.assert_close(emb, rms_params["transformer.wte.weight"] @ rotation.T)
    assert _rel_err(outputs(module, params, x), outputs(wide, wide_params, x)) <= 1e-4
    with pytest.raises(ValueError, match="orthonormal"):
        embed_in_wider(rms, rms_params, 10, rotation=2 * rotation)
    with pytest.raises(ValueError, match="rotation must be"):
        embed_in_wider(rms, rms_params, 12, rotation=rotation)
    with pytest.raises(ValueError, match="heads"):
        embed_in_wider(rms, rms_params, 9)


def test_rewrites_reject_the_wrong_norm() -> None:
    module, params, _ = _model("gpt2", {})
    with pytest.raises(ValueError, match="one orthogonal residual stream"):
        embed_in_wider(module, params, 16)
    rms, rms_params = layernorm_to_rmsnorm(module, params)
    with pytest.raises(ValueError, match="has LayerNorms"):
        layernorm_to_rmsnorm(rms, rms_params)
    tied_rms, tied_params = create_model("gpt2", norm="rms", **TINY["gpt2"])
    with pytest.raises(ValueError, match="untie"):
        embed_in_wider(tied_rms, tied_params, 16)


@pytest.mark.parametrize(("name", "extra"), VARIANTS)
@pytest.mark.parametrize("form", ["layer", "rms", "wider"])
def test_heads_to_circuits_keeps_logits(outputs, name: str, extra: dict, form: str) -> None:
    module, params, x = _model(name, extra)
    want = outputs(module, params, x)
    source, source_params = module, params
    if form != "layer":
        source, source_params = layernorm_to_rmsnorm(module, params)
    if form == "wider":
        source, source_params = embed_in_wider(source, source_params, 12, rotation=1)
    before = {k: v.clone() for k, v in source_params.items()}
    circuits, circuit_params = heads_to_circuits(source, source_params)
    assert circuits.attention == "circuits" and circuits.norm == source.norm
    spec = circuits.symmetry_spec()
    spec.validate(circuit_params)
    width = spec["residual"].n
    qk = [k for k in circuit_params if k.endswith("qk_weight")]
    assert len(qk) == 2 and all(circuit_params[k].shape == (2, width, width) for k in qk)
    assert not any("c_attn" in k or ".query." in k for k in circuit_params)
    assert _rel_err(want, outputs(circuits, circuit_params, x)) <= 1e-4
    assert all(torch.equal(before[k], source_params[k]) for k in before)  # inputs untouched
    # the residual group acts on both sides of every circuit: still exact
    for seed in range(2):
        moved = apply(spec, circuit_params, random_transform(spec, seed))
        assert _rel_err(want, outputs(circuits, moved, x)) <= 1e-4


def test_circuits_forget_the_bases_inside_heads() -> None:
    """Two parameterisations of one GPT-2 that differ only inside heads: same circuits."""
    module, params, _ = _model("gpt2", {})
    gen = torch.Generator().manual_seed(5)
    rebased = dict(params)
    w = params["transformer.h.0.attn.c_attn.weight"].clone()
    b = params["transformer.h.0.attn.c_attn.bias"].clone()
    o = params["transformer.h.0.attn.c_proj.weight"].clone()
    head = slice(0, 4)  # head 0 of 2 (head_dim 4): query rows, key rows + 8, value + 16
    key, value = slice(8, 12), slice(16, 20)
    m = torch.randn(4, 4, generator=gen) + 3 * torch.eye(4)
    n = torch.randn(4, 4, generator=gen) + 3 * torch.eye(4)
    w[head], b[head] = m @ w[head], m @ b[head]
    inv_t = torch.linalg.inv(m).T
    w[key], b[key] = inv_t @ w[key], inv_t @ b[key]
    w[value], b[value] = n @ w[value], n @ b[value]
    o[:, head] = o[:, head] @ torch.linalg.inv(n)
    rebased["transformer.h.0.attn.c_attn.weight"] = w
    rebased["transformer.h.0.attn.c_attn.bias"] = b
    rebased["transformer.h.0.attn.c_proj.weight"] = o
    assert not torch.allclose(w, params["transformer.h.0.attn.c_attn.weight"])
    _, first = heads_to_circuits(module, params)
    _, second = heads_to_circuits(module, rebased)
    for key_name in first:
        torch.testing.assert_close(first[key_name], second[key_name], rtol=1e-4, atol=1e-5)


def test_rewrites_need_projected_heads() -> None:
    module, params, _ = _model("gpt2", {})
    circuits, circuit_params = heads_to_circuits(module, params)
    for rewrite in (layernorm_to_rmsnorm, heads_to_circuits):
        with pytest.raises(ValueError, match="projected heads"):
            rewrite(circuits, circuit_params)
    rms, rms_params = heads_to_circuits(*layernorm_to_rmsnorm(module, params))
    with pytest.raises(ValueError, match="projected heads"):
        embed_in_wider(rms, rms_params, 16)
