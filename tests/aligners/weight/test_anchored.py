"""The anchored start of weight matching: its schedule, closed-form recovery, the default."""

from __future__ import annotations

import pytest
import torch

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.aligners._weight.anchored import anchor_stages, anchored_start
from lmckit.forms._recipe import aligned_form
from lmckit.groups import Orthogonal, Permutation
from lmckit.models import create_model
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import Nest, Part, Space, SymmetrySpec, Transform, Use, apply


def _ndims(params: dict) -> dict[str, int]:
    return {k: v.ndim for k, v in params.items()}


def _gpt2(seed: int = 0):
    return create_model(
        "gpt2", seed=seed, vocab_size=23, n_layer=2, n_head=2, n_embd=8, n_inner=16, context=6
    )


def _circuit_form(seed: int = 0):
    module, params = _gpt2(seed)
    gen = torch.Generator().manual_seed(seed + 100)
    # non-trivial norm parameters, so folding them is exercised
    params = {
        k: (
            torch.rand(v.shape, generator=gen) + 0.5
            if k.endswith(("ln_1.weight", "ln_f.weight"))
            else v
        )
        for k, v in params.items()
    }
    return aligned_form(module, params, params, symmetry="orthogonal", circuits=True)


def test_mlp_is_solved_from_both_ends_inwards() -> None:
    module, params = create_model("mlp", seed=0, in_features=5, hidden=[7] * 4, out_features=3)
    spec = module.symmetry_spec()
    stages = anchor_stages(spec, _ndims(params))
    names = [[name for name, _ in stage] for stage in stages]
    first, last = spec.names[0], spec.names[-1]
    assert names == [[first, last], [spec.names[1], spec.names[2]]]
    # the first layer is solved from its own (input-side) weights, the last from the
    # output layer's: never through an unsolved neighbour
    for _name, uses in stages[0]:
        for use in uses:
            others = {s.name for s, u in spec.uses_of(use.param) if u.axis != use.axis}
            assert not others


def test_gpt2_residual_first_from_token_axes_then_heads_and_units() -> None:
    form = _circuit_form()
    stages = anchor_stages(form.spec, _ndims(form.a))
    assert [name for name, _ in stages[0]] == ["residual"]
    matrices = {u.param for u in stages[0][0][1] if form.a[u.param].ndim > 1}
    assert matrices == {"transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"}
    assert sorted(name for name, _ in stages[1]) == ["ffn.0", "ffn.1", "heads.0", "heads.1"]
    assert len(stages) == 2


def test_spaces_left_out_count_as_solved() -> None:
    form = _circuit_form()
    stages = anchor_stages(form.spec, _ndims(form.a), names=["ffn.1"])
    assert [[name for name, _ in s] for s in stages] == [["ffn.1"]]


def test_anchored_start_recovers_a_planted_rotation_in_closed_form() -> None:
    """B = T(A) with a random rotation, head and unit permutations: the staged solves
    alone (no coordinate descent) return T^-1, so B maps back onto A exactly."""
    form = _circuit_form()
    spec, a = form.spec, form.a
    planted = random_transform(spec, torch.Generator().manual_seed(3))
    b = apply(spec, a, planted)
    start = Transform.identity(spec)
    found = anchored_start(spec, a, b, start)
    back = apply(spec, b, found)
    for k in a:
        torch.testing.assert_close(back[k], a[k], atol=1e-4, rtol=1e-4)


def test_weight_matching_default_is_anchored_and_recovers_permuted_mlp() -> None:
    assert WeightMatchingConfig().start == "anchored"
    module, a = create_model("mlp", seed=0, in_features=6, hidden=[9, 9, 9], out_features=4)
    spec = module.symmetry_spec()
    b = apply(spec, a, random_transform(spec, torch.Generator().manual_seed(1)))
    result = weight_matching(spec, a, b)
    back = result.apply(b)
    for k in a:
        torch.testing.assert_close(back[k], a[k])


def test_default_start_recovers_a_planted_rotation_in_one_sweep() -> None:
    form = _circuit_form(seed=1)
    spec, a = form.spec, form.a
    b = apply(spec, a, random_transform(spec, torch.Generator().manual_seed(4)))
    result = weight_matching(spec, a, b, WeightMatchingConfig(max_iter=1))
    back = result.apply(b)
    for k in a:
        torch.testing.assert_close(back[k], a[k], atol=1e-4, rtol=1e-4)


def test_unknown_start_is_refused() -> None:
    with pytest.raises(
        ValueError, match="start must be one of anchored, identity, best, got 'random'"
    ):
        WeightMatchingConfig(start="random")


def test_heads_compared_by_raw_weights_wait_for_the_bases_inside_them() -> None:
    """Heads whose value rows a basis inside each head also moves (and no circuits to
    compare them invariantly): their uses are not anchored while those bases are
    unsolved, so the start does not pair heads by rows a rotation scrambled."""
    heads, dim = 2, 3
    parent = Space(
        "heads",
        heads,
        Permutation(),
        (Use("v.weight", 0, "write", 1, dim), Use("o.weight", 1, "read", 1, dim)),
    )
    bases = tuple(
        Space(
            f"heads.value.{h}",
            dim,
            Orthogonal(),
            (
                Use("v.weight", 0, "write", parts=(Part(0, h * dim, dim),)),
                Use("o.weight", 1, "read", parts=(Part(1, h * dim, dim),)),
            ),
            nest=Nest("heads", h, "value"),
        )
        for h in range(heads)
    )
    spec = SymmetrySpec((parent, *bases))
    stages = anchor_stages(spec, {"v.weight": 2, "o.weight": 2})
    assert stages == []  # nothing anchored: descent starts them all from the identity
