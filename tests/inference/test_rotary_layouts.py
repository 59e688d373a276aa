"""Families whose rotary layout or query/key norm used to stop every command in one line
(``duplicate space names``: an interleaved view splits a head's dimension in two; an axis
claimed by two spaces; a rotation acting on a norm's weight). Each now gets the group its
layout allows, found by the check (dims ``i, i + r/2`` or ``2i, 2i + 1`` paired, over the
first ``r`` dims; an orthogonal block for the rest), or a line saying why its query/key
basis is fixed; the rest of the spec is kept and keeps the function.
"""

from __future__ import annotations

import pytest
from tests.inference.tiny_hf import DECODER, tiny

from lmckit.groups import Group, PlaneSigns, RotaryPlanes
from lmckit.hf import example_inputs
from lmckit.inference import analyze_symmetries, check_spec

_MHA = {k: v for k, v in DECODER.items() if k != "num_key_value_heads"}
#: family -> (config, model, options, the query/key group, or None: left out)
CASES: dict[str, tuple[str, str, dict, Group | None]] = {
    # interleaved over the whole head, a LayerNorm over each head's features (qk-norm
    # with the mean subtracted: no sign survives it)
    "cohere": ("CohereConfig", "CohereForCausalLM", DECODER, RotaryPlanes(8, interleaved=True)),
    "cohere-qk-norm": ("CohereConfig", "CohereForCausalLM", DECODER | dict(use_qk_norm=True), None),
    # interleaved over half the head
    "glm": ("GlmConfig", "GlmForCausalLM", DECODER | dict(head_dim=8, pad_token_id=0),
            RotaryPlanes(4, interleaved=True)),
    # rotate-half over half the head
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", DECODER | dict(partial_rotary_factor=0.5),
                 RotaryPlanes(4)),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM",
                dict(vocab_size=61, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=16,
                     bos_token_id=0, eos_token_id=0), RotaryPlanes(4, interleaved=True)),
    # a fused (heads, 3, head_dim) view, a LayerNorm over each head's queries and keys
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM",
                  _MHA | dict(partial_rotary_factor=0.5), None),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               DECODER | dict(head_dim=8, sliding_window=4), PlaneSigns(8)),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(CASES))
def test_the_query_key_basis_takes_the_layout_of_the_family(family: str) -> None:
    config, cls, options, expected = CASES[family]
    model = tiny(config, cls, **options)
    analysis = analyze_symmetries(model, example_inputs(model))
    kinds = {s.nest.kind: s.group for s in analysis.spec if s.nest is not None}
    assert "value" in kinds, analysis.left_out
    if expected is None:
        assert "qk" not in kinds
        assert any("query/key basis inside its heads is fixed" in x for x in analysis.left_out)
    else:
        assert kinds.get("qk") == expected, analysis.left_out
    assert all("\n" not in line for line in analysis.left_out)
    # what is kept keeps the function (another seed than the inference's own check; some
    # of these modules compute in float32 whatever their weights, hence float32's 1e-5)
    errors = check_spec(model, analysis.spec, example_inputs(model), seed=7)
    assert errors["all"] < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "cls", "options"),
    [
        ("OlmoeConfig", "OlmoeForCausalLM",
         dict(intermediate_size=48, num_experts=4, num_experts_per_tok=2)),
        ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
         dict(head_dim=8, moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
              decoder_sparse_step=1)),
    ],
)  # fmt: skip
def test_mixtures_with_a_query_key_norm_keep_experts_and_plane_signs(
    config: str, cls: str, options: dict
) -> None:
    model = tiny(config, cls, **(DECODER | options))
    analysis = analyze_symmetries(model, example_inputs(model))
    kinds = {s.nest.kind: s.group for s in analysis.spec if s.nest is not None}
    assert kinds.get("qk") == PlaneSigns(8) and "units" in kinds, analysis.left_out
    assert any(s.name.startswith("experts.") for s in analysis.spec)
    assert check_spec(model, analysis.spec, example_inputs(model), seed=7)["all"] < 1e-5
