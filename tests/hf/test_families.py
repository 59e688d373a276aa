"""Coverage of the families people use (docs/families.md), from tiny random configs.

Per family: the components whose symmetries inference finds (residual stream, heads,
query heads within key/value groups, value and query/key bases, MLP units, experts),
the share of parameters some space moves, and -- the real property -- a random element
of the *whole* inferred group planted into a copy of the folder is undone by
``lmckit align A B --method weight``: the output is A's weights again and loads with
``AutoModel*.from_pretrained``, computing B's function. Families whose stream admits
rotations (norm scales folded) are checked with ``--symmetry orthogonal`` too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tests.hf.known_misses import known
from tests.tiny_models import ALL_FAMILIES

from lmckit.cli import main
from lmckit.forms._recipe import aligned_form
from lmckit.hf import example_inputs, load_hf, save_hf
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import SymmetrySpec, apply

_ATTENTION = {"residual", "heads", "value", "qk", "units"}
_GQA = _ATTENTION | {"query"}
#: per family: the components its architecture has (see :func:`components`) and the least
#: share of parameters moved; what inference misses today is a ``family/found`` entry of
#: tests/hf/known_misses.py, and a component missing here has a reason in docs/families.md
EXPECTED: dict[str, tuple[set[str], float]] = {
    "llama": (_GQA, 0.99),
    "mistral": (_GQA, 0.99),
    "qwen2": (_GQA, 0.99),
    "gemma": (_GQA, 0.99),
    "phi3": (_GQA, 0.99),
    "mixtral": (_GQA | {"experts"}, 0.99),
    "phi": (_ATTENTION, 0.99),
    "gptj": (_ATTENTION, 0.99),
    "gpt2": ({"residual", "heads", "qk", "value", "units"}, 0.99),
    "gpt_neox": ({"residual", "heads", "value", "qk", "units"}, 0.99),
    "opt": (_ATTENTION, 0.99),
    "bert": (_ATTENTION, 0.99),
    "roberta": (_ATTENTION, 0.99),
    "distilbert": (_ATTENTION, 0.99),
    "electra": (_ATTENTION, 0.99),
    "deberta-v2": ({"residual", "heads", "qk", "value", "units"}, 0.99),
    "t5": (_ATTENTION, 0.99),
    "bart": (_ATTENTION, 0.99),
    "vit": (_ATTENTION, 0.99),
    "bloom": ({"residual", "value", "qk", "units"}, 0.99),  # ALiBi fixes the heads
    "falcon": ({"residual", "heads", "qk", "value", "units"}, 0.99),
    "clip": ({"heads", "value", "qk", "units"}, 0.7),
    "convnext": ({"residual", "units"}, 0.99),
    "resnet": ({"residual", "units"}, 0.99),
    # 2025-2026 decoders; where a norm over each head's queries and keys (qk-norm) keeps
    # only discrete query/key maps, no qk space is expected
    "qwen3": (_GQA - {"qk"}, 0.99),
    "olmo2": (_GQA - {"qk"}, 0.99),
    "gemma2": (_GQA, 0.99),
    "gemma3": (_GQA - {"qk"}, 0.99),
    "cohere": (_GQA, 0.99),
    "stablelm": (_GQA, 0.99),
    "starcoder2": (_GQA, 0.99),
    "granite": (_GQA, 0.99),
    "nemotron": (_GQA, 0.99),
    "smollm3": (_GQA, 0.99),
    "mpt": ({"residual", "value", "qk", "units"}, 0.99),  # ALiBi fixes the heads
    "qwen3_moe": (_GQA - {"qk"} | {"experts"}, 0.99),
    "qwen2_moe": (_GQA | {"experts"}, 0.99),
    "olmoe": (_GQA - {"qk"} | {"experts"}, 0.99),
    "deepseek_v3": ({"residual", "heads", "value", "qk", "units", "experts"}, 0.99),
    "modernbert": (_ATTENTION, 0.99),
    "xlm-roberta": (_ATTENTION, 0.99),
    "albert": (_ATTENTION, 0.99),
    "whisper": (_ATTENTION, 0.99),
    "dinov2": (_ATTENTION, 0.99),
    "siglip": (_ATTENTION, 0.99),
    "deit": (_ATTENTION, 0.99),
    "beit": (_ATTENTION, 0.99),
    "swin": (_ATTENTION, 0.99),
}
#: families whose stream admits rotations once norm scales are folded (an output head
#: tied to the embedding untied to take the final norm's scale; the rest: post-LayerNorm,
#: convolutions, the output is the stream)
ORTHOGONAL = ("llama", "mistral", "mixtral", "qwen2", "gemma", "phi", "phi3", "gpt_neox", "gptj",
              "opt", "falcon")  # fmt: skip
#: more families whose stream admits rotations, checked with ``-m slow`` (the independent
#: planter rotates their streams too, tests/hf/test_families_oracle.py)
ORTHOGONAL_SLOW = ("stablelm", "starcoder2", "granite", "smollm3", "qwen2_moe", "deit")
#: the symmetry each family's whole planted group is drawn from: every inferred space
#: (DeBERTa's written-out attention included, whose heads are compared by circuits).
PLANTED = {name: None for name in ALL_FAMILIES}


def components(spec: SymmetrySpec) -> set[str]:
    """What the spaces of ``spec`` move: ``residual``, ``heads``, ``units`` (any other
    space of the model), and the kinds of spaces nested in units or shared by every head
    (``query``, ``value``, ``qk``, ``basis``, ``units`` of experts)."""
    found = set()
    for space in spec:
        if (where := space.nest or space.inside) is not None:  # inside: heads of fixed order
            found.add(re.sub(r"\d+$", "", where.kind))
        elif shared := re.fullmatch(r"heads\.\d+\.([a-z]+)", space.name):
            found.add(shared.group(1))  # a basis every head shares (multi-query attention)
        elif space.name.startswith("residual"):
            found.add("residual")
        elif space.name.startswith("heads"):
            found.add("heads")
        elif space.name.startswith("experts"):
            found.add("experts")
        else:
            found.add("units")
    return found


def _moved_share(spec: SymmetrySpec, params: dict[str, torch.Tensor]) -> float:
    moved = {u.param for s in spec for u in s.uses}
    return sum(v.numel() for k, v in params.items() if k in moved) / sum(
        v.numel() for v in params.values()
    )


@pytest.mark.parametrize(
    "name", [pytest.param(f, marks=known(f"{f}/found")) for f in sorted(ALL_FAMILIES)]
)
def test_what_inference_finds(name: str, hf_folder) -> None:
    model = load_hf(hf_folder(name))
    analysis = analyze_symmetries(model.module, example_inputs(model))
    expected, share = EXPECTED[name]
    assert expected <= components(analysis.spec), (components(analysis.spec), analysis.left_out)
    assert _moved_share(analysis.spec, model.params) >= share
    # activation matching sees every space not inside heads (Falcon's layers are written
    # x @ W.T: their inputs are probes too); a mixture's experts have no module of their own
    unseen = {s.name for s in analysis.spec if not s.enclosed and not s.probes}
    assert {u for u in unseen if not u.startswith("experts.")} == set()


def _distance(a: dict, b: dict) -> float:
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a).sqrt())


@pytest.mark.parametrize(
    ("name", "symmetry"),
    [
        pytest.param(name, symmetry, marks=known(f"{name}/inferred"))
        for name, symmetry in sorted(PLANTED.items()) + [(f, "orthogonal") for f in ORTHOGONAL]
    ]
    + [pytest.param(f, "orthogonal", marks=pytest.mark.slow) for f in ORTHOGONAL_SLOW],
)
def test_align_undoes_a_planted_element_of_the_whole_group(
    name: str, symmetry: str | None, hf_folder, load_with_transformers, logits, tmp_path: Path
) -> None:
    a_path = hf_folder(name)
    model = load_hf(a_path)
    form = aligned_form(model.module, model.params, model.params, symmetry=symmetry)
    moved = apply(form.spec, form.a, random_transform(form.spec, seed=7))
    save_hf(tmp_path / "b", model, moved)
    if set(form.a) != set(model.params):
        # an output head untied to take the final norm's scale: B rotated is untied, so
        # A is given in the same form (tests/hf/test_untied_head.py: two tied models)
        a_path = tmp_path / "a"
        save_hf(a_path, model, form.a)
    out = tmp_path / "out"
    extra = ["--symmetry", symmetry] if symmetry else []
    result = CliRunner().invoke(
        main,
        ["align", str(a_path), str(tmp_path / "b"), "--method", "weight", *extra,
         "--no-circuits", "--out", str(out), "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    aligned = load_hf(out)
    before, after = _distance(moved, form.a), _distance(aligned.params, form.a)
    assert before > 0.5 and after / before < 1e-4, (before, after)
    x = example_inputs(aligned)
    b = load_with_transformers(name, tmp_path / "b")
    reloaded = load_with_transformers(name, out)
    scale = float(logits(b, x).abs().max())
    assert float((logits(reloaded, x) - logits(b, x)).abs().max()) < 1e-4 * max(scale, 1.0)


#: families whose stream admits no rotation, and the reason lmckit gives (docs/families.md)
NOT_ORTHOGONAL = {
    "bert": "add",  # post-LayerNorm: a norm's output is summed into the stream
    "t5": "T5ForConditionalGeneration ties its output head to the embedding whatever its "
    "config says",
    "clip": "output",  # the model's output is the stream itself
    "resnet": "every space passes through ops that act unit by unit",
}


@pytest.mark.parametrize("name", sorted(NOT_ORTHOGONAL))
def test_a_stream_without_rotations_is_refused_with_its_reason(name: str, hf_folder) -> None:
    model = load_hf(hf_folder(name))
    with pytest.raises(ValueError, match="no space that admits orthogonal maps") as refused:
        aligned_form(model.module, model.params, model.params, symmetry="orthogonal")
    assert NOT_ORTHOGONAL[name] in str(refused.value)
    assert "\n" not in str(refused.value)
