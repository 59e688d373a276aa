"""Norm scales folded into their readers (:mod:`lmckit.inference._fold`), on a bfloat16 Llama."""

from __future__ import annotations

import pytest
import torch
from tests.recorded import RecordedParams
from torch.func import functional_call

from lmckit.forms._recipe import default_inputs
from lmckit.groups import Orthogonal
from lmckit.inference import analyze_symmetries, infer_spec
from lmckit.inference._fold import FoldedParams, fold_norm_scales
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import Float32View, module_params, stored_params
from lmckit.symmetry._transform import apply

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = transformers.LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    module = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in module.parameters():  # norm scales that are not all ones
            p.add_(0.1 * torch.randn_like(p))
    module = module.to(torch.bfloat16)
    return module, dict(module_params(module))


def _outputs(module: torch.nn.Module, params: dict[str, torch.Tensor]) -> torch.Tensor:
    inputs = default_inputs(module)
    wide = {k: v.float() if v.is_floating_point() else v for k, v in params.items()}
    with torch.no_grad():
        return functional_call(module, wide, (inputs[0],), {"use_cache": False}).logits


def test_the_folded_model_computes_the_same_function_and_holds_no_copy(llama) -> None:
    module, params = llama
    analysis = analyze_symmetries(module, default_inputs(module), params=params, check=False)
    folded = fold_norm_scales(analysis, params)
    assert isinstance(folded.params, FoldedParams)
    assert folded.readers  # q/k/v, gate/up and the LM head read a norm
    torch.testing.assert_close(
        _outputs(module, dict(folded.params)), _outputs(module, params), rtol=1e-4, atol=1e-4
    )
    # everything but the scales themselves is the source's own tensor or computed when
    # read: the folded model holds no float32 copy of a bfloat16 one
    held = sum(v.numel() * v.element_size() for v in folded.params.replaced.values())
    scales = sum(params[k].numel() * params[k].element_size() for k in folded.scales)
    assert held <= 2 * scales
    for key in params:
        if key not in folded.params.replaced and key not in folded.params.factors:
            assert folded.params[key] is params[key]
    # a reader is its stored weight times the norm's scale on its input axis, in float32
    reader, scale = next(iter(folded.readers.items()))
    expected = params[reader].double() * params[scale].double()
    assert folded.params[reader].dtype == torch.float32
    torch.testing.assert_close(folded.params[reader].double(), expected, rtol=1e-6, atol=0)


def test_the_fold_needs_the_graph_alone_and_reads_no_value(llama) -> None:
    module, params = llama
    recorded = RecordedParams(params)
    inputs = default_inputs(module)
    graph_only = analyze_symmetries(module, inputs, params=recorded, check=False, decide=False)
    assert recorded.reads == set()
    decided = analyze_symmetries(module, inputs, params=params, check=False)
    # the proposals decided by running the model (rotary query/key bases) are left out...
    assert set(graph_only.spec.names) < set(decided.spec.names)
    # ...and the fold is the same
    a, b = fold_norm_scales(graph_only, params), fold_norm_scales(decided, params)
    assert a.scales == b.scales and a.readers == b.readers


def test_a_folded_model_is_moved_in_float32_and_kept_in_its_stored_dtype(llama) -> None:
    module, params = llama
    analysis = analyze_symmetries(module, default_inputs(module), params=params, check=False)
    folded = fold_norm_scales(analysis, params)
    spec = infer_spec(module, default_inputs(module), params=folded.params, uniform=folded.scales)
    assert isinstance(spec["residual"].group, Orthogonal)
    transform = random_transform(spec, 0)
    moved = apply(spec, folded.params, transform)
    assert {v.dtype for v in moved.values() if v.is_floating_point()} == {torch.bfloat16}
    # rounded once: the float32 result of the whole float32 folded model, rounded
    whole = apply(spec, dict(folded.params), transform)
    for key, value in moved.items():
        assert torch.equal(value, whole[key].to(value.dtype)), key
    # and what is stored of the folded model is it, rounded once
    stored = stored_params(folded.params)
    assert all(torch.equal(stored[k], folded.params[k].to(params[k].dtype)) for k in params)
    # weight matching reads it through a float32 view: each tensor computed when read
    view = Float32View(folded.params)
    reader = next(iter(folded.readers))
    assert set(view) == set(params)
    assert torch.equal(view[reader], folded.params[reader])


def test_a_block_of_rows_is_computed_alone_and_equals_those_rows_of_the_whole() -> None:
    gen = torch.Generator().manual_seed(0)
    source = {
        "w": torch.randn(7, 5, generator=gen).to(torch.bfloat16),  # scales on both axes
        "v": torch.randn(6, 3, generator=gen),  # not a reader
        "g": torch.randn(5, generator=gen),  # replaced
    }
    factors = {"w": [(torch.rand(7, generator=gen) + 0.5, 0), (torch.rand(5, generator=gen), 1)]}
    folded = FoldedParams(source, factors, {"g": torch.ones(5)})
    for key, (start, stop) in {"w": (2, 6), "v": (0, 4), "g": (1, 3)}.items():
        block = folded.rows(key, start, stop)
        assert block.dtype == folded.dtype_of(key)
        assert torch.equal(block, folded[key][start:stop])
    # through the float32 view too
    view = Float32View(folded)
    assert torch.equal(view.rows("w", 3, 7), view["w"][3:7])
