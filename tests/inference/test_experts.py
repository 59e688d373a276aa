"""Mixtures of experts: the expert permutation and the units of each expert.

Built from a tiny ``transformers`` Mixtral config (random weights): the experts are
stacked weights multiplied segment by segment, the segments chosen by a router's top-k.
"""

from __future__ import annotations

import types

import pytest
import torch
import transformers

from lmckit.aligners import weight_matching
from lmckit.hf import example_inputs
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import module_params
from lmckit.symmetry._transform import Nest, Permutation, apply

EXPERTS, UNITS, LAYERS = 4, 24, 2


def _mixtral() -> torch.nn.Module:
    config = transformers.MixtralConfig(
        vocab_size=61, hidden_size=32, num_hidden_layers=LAYERS, intermediate_size=UNITS,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=EXPERTS,
        num_experts_per_tok=2, max_position_embeddings=16, use_cache=False,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.MixtralForCausalLM(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
    return model


def test_experts_permute_with_their_router_and_their_units_each_on_their_own() -> None:
    model = _mixtral()
    analysis = analyze_symmetries(model, example_inputs(model))
    spec = analysis.spec
    pre = "model.layers.0.mlp."
    experts = spec["experts.0"]
    assert experts.group == Permutation() and experts.n == EXPERTS
    assert {(u.param, u.axis) for u in experts.uses} == {
        (pre + "gate.weight", 0),
        (pre + "experts.gate_up_proj", 0),
        (pre + "experts.down_proj", 0),
    }
    units = [s for s in spec if s.nest is not None and s.nest.parent == "experts.0"]
    assert [s.nest for s in units] == [Nest("experts.0", e, "units") for e in range(EXPERTS)]
    assert all(s.n == UNITS for s in units)
    assert "residual" in spec.names  # the stream runs through the router and the experts
    assert not any("topk" in note for note in analysis.left_out)


def test_a_planted_element_of_the_whole_group_is_recovered() -> None:
    model = _mixtral()
    spec = analyze_symmetries(model, example_inputs(model)).spec
    a = module_params(model)
    b = apply(spec, a, random_transform(spec, 2))
    result = weight_matching(spec, a, b)
    back = apply(spec, b, result.transform)

    def distance(x: dict, y: dict) -> float:
        return sum(float((x[k] - y[k]).double().pow(2).sum()) for k in x)

    assert distance(a, b) > 1.0 and distance(a, back) / distance(a, b) < 1e-10


def test_experts_that_are_not_exchangeable_are_left_out_and_said_so() -> None:
    model = _mixtral()
    for layer in model.model.layers:
        router = layer.mlp.gate
        plain = router.forward

        def biased(self, hidden, plain=plain):  # a fixed preference for expert 0
            logits = torch.nn.functional.linear(hidden.reshape(-1, self.hidden_dim), self.weight)
            bias = torch.zeros(EXPERTS, dtype=logits.dtype)
            bias[0] = 3.0
            probs = (logits + bias).float().softmax(-1)
            top, index = torch.topk(probs, self.top_k, dim=-1)
            return logits, top / top.sum(-1, keepdim=True), index

        router.forward = types.MethodType(biased, router)
        del plain
    analysis = analyze_symmetries(model, example_inputs(model))
    assert not any(s.name.startswith("experts.") for s in analysis.spec)
    assert any("permuting the experts changes the function" in n for n in analysis.left_out)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_elements_keep_the_function(seed: int) -> None:
    model = _mixtral()
    x = example_inputs(model)
    spec = analyze_symmetries(model, x).spec
    params = module_params(model)
    moved = apply(spec, params, random_transform(spec, seed))
    with torch.no_grad():
        want = model(*x).logits
        got = torch.func.functional_call(model, moved, x).logits
    assert float((want - got).abs().max()) < 1e-4
