"""The aligner registry: one signature, every registered aligner recovers a planted copy."""

from __future__ import annotations

import pytest
import torch

from lmckit.aligners import (
    AlignmentResult,
    AlignRun,
    LearnedMatchingConfig,
    aligner_info,
    get_aligner,
    list_aligners,
    register_aligner,
)
from lmckit.aligners._head_bases import HeadBases, apply_head_bases
from lmckit.aligners._registry import _check_signature
from lmckit.data import Dataset
from lmckit.forms._rewrites import layernorm_to_rmsnorm
from lmckit.groups import Orthogonal
from lmckit.models import create_model
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import apply

#: quick settings for methods whose defaults are minutes, not seconds
QUICK = {"learned_matching": LearnedMatchingConfig(steps=10, eval_every=5)}


def test_the_registered_aligners() -> None:
    assert list_aligners() == [
        "activation_matching",
        "head_bases",
        "learned_matching",
        "naive",
        "universe_matching",
        "weight_matching",
        "width_matching",
    ]
    for name in list_aligners():
        info = aligner_info(name)
        assert "https://arxiv.org/abs/" in info.paper, name
        assert info.summary, name
    assert aligner_info("learned_matching").needs_data
    assert not aligner_info("weight_matching").needs_model


def test_a_typo_lists_the_valid_names() -> None:
    with pytest.raises(
        KeyError,
        match="unknown aligner 'weigth_matching'; known aligners: "
        "activation_matching, head_bases, learned_matching, naive, "
        "universe_matching, weight_matching, width_matching",
    ):
        get_aligner("weigth_matching")
    with pytest.raises(ValueError, match="already registered"):
        register_aligner("naive", paper="")(get_aligner("weight_matching"))


def test_registration_rejects_an_aligner_without_the_common_signature() -> None:
    def loose(spec, params_a, params_b, *, seed=1, init):
        raise AssertionError("never called")

    with pytest.raises(TypeError) as info:
        register_aligner("loose", paper="")(loose)
    assert str(info.value) == (
        "aligner 'loose' lacks the common signature: positional parameters "
        "('spec', 'params_a', 'params_b'), want ('spec', 'params_a', 'params_b', 'config'); "
        "needs keyword-only model=None; needs keyword-only data=None; needs keyword-only "
        "seed=0; needs keyword-only progress=False; needs keyword-only device=None; "
        "options without a default: ['init']"
    )
    assert "loose" not in list_aligners()

    def fits(
        spec,
        params_a,
        params_b,
        config=None,
        *,
        model=None,
        data=None,
        seed=0,
        progress=False,
        device=None,
        extra=3,
    ):
        raise AssertionError("never called")

    _check_signature("fits", fits)  # passes: further options are fine when optional


def _gpt2_with_random_head_bases():
    kwargs = {"vocab_size": 30, "n_layer": 1, "n_head": 2, "n_embd": 16, "context": 8}
    module, a = layernorm_to_rmsnorm(*create_model("gpt2", seed=0, **kwargs))
    spec = module.symmetry_spec()
    gen = torch.Generator().manual_seed(1)
    maps = {}
    for space in spec:
        if space.circuits is not None:
            h, d = space.group.heads, space.group.head_dim
            draw = [torch.stack([Orthogonal().random(d, gen) for _ in range(h)]) for _ in "qo"]
            maps[space.name] = (draw[0], draw[1])
    return module, spec, a, apply_head_bases(spec, a, HeadBases(maps))


@pytest.mark.parametrize("name", list_aligners())
def test_every_aligner_recovers_a_transformed_copy(name: str, digits: Dataset) -> None:
    """B is A under a random element of the method's symmetry; aligning B gives A back."""
    info = aligner_info(name)
    if name == "head_bases":
        module, spec, a, b = _gpt2_with_random_head_bases()
    else:
        module, a = create_model("mlp", seed=0, in_features=64, hidden=[16, 16], out_features=10)
        spec = module.symmetry_spec()
        b = apply(spec, a, random_transform(spec, 2))
    config = QUICK.get(name, info.config() if info.config else None)
    result = get_aligner(name)(spec, a, b, config, model=module, data=digits, seed=0)
    assert isinstance(result, AlignmentResult)  # the one result type, subclasses allowed
    moved = result.apply(b)
    if name == "naive":  # the baseline moves nothing
        assert all(torch.equal(moved[k], b[k]) for k in b)
        return
    for k in a:
        torch.testing.assert_close(moved[k], a[k], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["weight_matching", "activation_matching"])
def test_a_run_context_calls_the_aligner_as_its_keywords_do(name: str, digits: Dataset) -> None:
    module, a = create_model("mlp", seed=0, in_features=64, hidden=[16, 16], out_features=10)
    _, b = create_model("mlp", seed=1, in_features=64, hidden=[16, 16], out_features=10)
    spec = module.symmetry_spec()
    info = aligner_info(name)
    by_keywords = info.fn(spec, a, b, None, model=module, data=digits, seed=3)
    by_run = info.run(spec, a, b, None, AlignRun(model=module, data=digits, seed=3))
    for space in spec.names:
        assert torch.equal(by_run.transform.elements[space], by_keywords.transform.elements[space])
    assert by_run.history == by_keywords.history


def test_a_run_context_without_what_the_method_needs_is_refused_in_one_line() -> None:
    module, a = create_model("mlp", seed=0, in_features=64, hidden=[16], out_features=10)
    spec = module.symmetry_spec()
    info = aligner_info("learned_matching")
    with pytest.raises(ValueError, match="^learned_matching runs the network: give run.model$"):
        info.run(spec, a, a)
    with pytest.raises(ValueError, match="^learned_matching needs training data: give run.data$"):
        info.run(spec, a, a, None, AlignRun(model=module))
    assert info.takes("row_masks") and not aligner_info("naive").takes("row_masks")
