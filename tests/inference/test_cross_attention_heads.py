"""T5's heads: self-attention heads share one learned position bias (every layer reads the
same table, indexed by head), so their order is one for all layers; cross-attention
heads have no bias (a table of zeros that every decoder layer is handed), so each
layer's cross-attention heads permute on their own. A table of constants meets the
scores without tying the layers that read it; a learned one ties them.

The plant is written from T5's math (per head: ``softmax(q k^T + bias) v``, then
``o``): the cross-attention heads of each decoder layer permuted by a permutation of
their own (rows of ``q``, ``k``, ``v``, columns of ``o``, in blocks of ``d_kv``).
"""

from __future__ import annotations

import torch
from tests.inference.tiny_hf import outputs, params_of, recover, relative, tiny

from lmckit.hf import example_inputs
from lmckit.inference import analyze_symmetries

HEADS, D_KV = 4, 8


def _t5() -> torch.nn.Module:
    return tiny(
        "T5Config", "T5ForConditionalGeneration", vocab_size=61, d_model=32, d_kv=D_KV,
        d_ff=37, num_layers=2, num_heads=HEADS, decoder_start_token_id=0,
    )  # fmt: skip


def _cross(layer: int) -> str:
    return f"decoder.block.{layer}.layer.1.EncDecAttention"


def _heads_of(spec, param: str) -> set[str]:  # type: ignore[no-untyped-def]
    return {s.name for s in spec if s.name.startswith("heads.") and s.nest is None
            for u in s.uses if u.param == param}  # fmt: skip


def test_each_decoder_layer_has_its_own_cross_attention_heads() -> None:
    model = _t5()
    spec = analyze_symmetries(model, example_inputs(model)).spec
    first, second = (_heads_of(spec, f"{_cross(i)}.q.weight") for i in (0, 1))
    assert len(first) == len(second) == 1 and first != second
    # self-attention heads stay tied across layers by the shared relative position bias
    selfs = [_heads_of(spec, f"{part}.block.{i}.layer.0.SelfAttention.q.weight")
             for part in ("encoder", "decoder") for i in (0, 1)]  # fmt: skip
    assert selfs[0] == selfs[1] and selfs[2] == selfs[3]


def _plant_per_layer(params: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = dict(params)
    for layer in range(2):
        perm = torch.randperm(HEADS, generator=gen)
        while bool((perm == torch.arange(HEADS)).all()):
            perm = torch.randperm(HEADS, generator=gen)
        rows = (perm[:, None] * D_KV + torch.arange(D_KV)).reshape(-1)
        for proj in "qkv":
            key = f"{_cross(layer)}.{proj}.weight"
            out[key] = out[key][rows]
        key = f"{_cross(layer)}.o.weight"
        out[key] = out[key][:, rows]
    return out


def test_align_undoes_a_permutation_of_each_layers_cross_attention_heads() -> None:
    model = _t5()
    planted = _plant_per_layer(params_of(model), seed=5)
    assert relative(outputs(model), outputs(model, planted)) < 1e-5
    found = recover(model, planted)
    assert found.before > 0.5
    assert found.after / found.before < 1e-4, found
    assert found.function < 1e-5
