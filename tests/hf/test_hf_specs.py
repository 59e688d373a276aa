"""Symmetries of Hugging Face models, inferred from their graphs: structure and exactness."""

from __future__ import annotations

from lmckit.aligners import weight_matching
from lmckit.groups import HeadPermutation, Permutation
from lmckit.hf import example_inputs, load_hf
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import apply

#: per family: (query heads, key/value heads, head width); GQA shares key heads
HEADS = {"gpt2": (2, 2, 16), "bert": (4, 4, 8), "vit": (4, 4, 8), "llama": (4, 2, 8)}
HEADS["mistral"] = HEADS["llama"]


#: per family, the kinds of spaces nested in each head (or key/value group) and their
#: groups: GPT-2's fused projection shares one basis for a head's queries, keys and
#: values; absolute positions leave the query/key basis free (orthogonal); rotary ones
#: leave each frequency plane free to rotate; grouped-query heads permute within a group
NESTED = {
    "gpt2": {"qk": "Orthogonal", "value": "Orthogonal"},
    "bert": {"qk": "Orthogonal", "value": "Orthogonal"},
    "vit": {"qk": "Orthogonal", "value": "Orthogonal"},
    "llama": {"query": "HeadPermutation", "value": "Orthogonal", "qk": "RotaryPlanes"},
    "mistral": {"query": "HeadPermutation", "value": "Orthogonal", "qk": "RotaryPlanes"},
}


def test_inferred_spaces(family, hf_folder) -> None:
    model = load_hf(hf_folder(family))
    analysis = analyze_symmetries(model.module, example_inputs(model))
    spec = analysis.spec
    assert not analysis.left_out, analysis.left_out
    layers = 2
    assert {"heads.0", "heads.1", "residual"} <= set(spec.names)
    outer = [s for s in spec if s.nest is None]
    assert len(outer) == 1 + 2 * layers  # residual, and per layer heads and FFN units
    # inside the units of each head space: what moves within a head or a key/value group
    nested = [s for s in spec if s.nest is not None and s.nest.parent == "heads.0"]
    kinds = {s.nest.kind: type(s.group).__name__ for s in nested if s.nest is not None}
    assert kinds == NESTED[family]
    units = spec["heads.0"].group.units(spec["heads.0"].n)
    assert len(nested) == units * len(kinds)
    assert spec["residual"].n == 32 and isinstance(spec["residual"].group, Permutation)
    q_heads, kv_heads, head_dim = HEADS[family]
    heads = spec["heads.0"]
    if q_heads == kv_heads:
        assert heads.group == HeadPermutation(q_heads, head_dim)
    else:  # grouped-query: key heads are the units; their query heads move with them
        assert heads.group == Permutation() and heads.n == kv_heads
        inner = {u.param.rsplit(".", 2)[-2]: u.inner for u in heads.uses}
        group = q_heads // kv_heads
        assert inner == {
            "q_proj": group * head_dim,
            "k_proj": head_dim,
            "v_proj": head_dim,
            "o_proj": group * head_dim,
        }
    if family in ("llama", "mistral"):  # gated MLP: gate and up rows share one permutation
        ffn = next(s for s in spec if "gate_proj" in s.name)
        assert {u.param.rsplit(".", 2)[-2] for u in ffn.uses} == {
            "gate_proj",
            "up_proj",
            "down_proj",
        }


def test_a_random_transform_keeps_the_logits_and_is_recovered(family, hf_folder, logits) -> None:
    model = load_hf(hf_folder(family))
    x = example_inputs(model)[0]
    spec = analyze_symmetries(model.module, (x,)).spec
    moved = apply(spec, model.params, random_transform(spec, seed=1))
    before, after = logits(model.module, x, model.params), logits(model.module, x, moved)
    assert float((before - after).abs().max()) < 1e-4 * float(before.abs().max())
    back = apply(spec, moved, weight_matching(spec, model.params, moved).transform)
    worst = max(float((back[k] - model.params[k]).abs().max()) for k in model.params)
    assert worst < 1e-5
