"""Symmetry specs and transforms: function invariance of ``apply``, its checks, spec errors.

The groups' own laws are tested in ``tests/groups``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from lmckit.models import create_model
from lmckit.symmetry._draw import distance_to_identity, random_transform
from lmckit.symmetry._params import Params, layout
from lmckit.symmetry._transform import (
    Group,
    HeadPermutation,
    Invertible,
    MovedParams,
    Orthogonal,
    Permutation,
    SemiPermutation,
    SemiPermutationElement,
    Space,
    SymmetrySpec,
    Transform,
    Use,
    apply,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- function invariance


def _assert_same_function(
    outputs: Callable[..., Tensor],
    module: nn.Module,
    params: Params,
    other: nn.Module,
    moved: Params,
    x: Tensor,
) -> None:
    torch.testing.assert_close(
        outputs(other, moved, x), outputs(module, params, x), atol=1e-4, rtol=1e-4
    )


def test_transform_changes_params_but_not_mlp_function_with_block_permutations(outputs) -> None:
    module, params = create_model("mlp", seed=0, in_features=5, hidden=[8, 6], out_features=3)
    spec = module.symmetry_spec().with_groups(
        **{"hidden.0": Permutation(blocks=2), "hidden.1": Permutation(blocks=2)}
    )
    transform = random_transform(spec, 0)
    moved = apply(spec, params, transform)
    assert not torch.equal(moved["layers.0.weight"], params["layers.0.weight"])
    x = torch.randn(10, 5, generator=_gen(0))
    _assert_same_function(outputs, module, params, module, moved, x)
    # and the inverse brings the parameters back
    back = apply(spec, moved, transform.inverse())
    for k in params:
        torch.testing.assert_close(back[k], params[k])


class HeadNet(nn.Module):
    """``x -> Linear -> per-head softmax over head_dim, gated -> Linear``.

    The fused ``proj`` writes ``(2, heads * head_dim)`` (value and gate halves, so
    ``outer = 2``). A softmax within each head is invariant to moving whole heads only.
    """

    def __init__(self, d_in: int, heads: int, head_dim: int, d_out: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.proj = nn.Linear(d_in, 2 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, d_out)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.proj(x).chunk(2, dim=-1)
        value = value.reshape(-1, self.heads, self.head_dim).softmax(-1).flatten(1)
        return self.out(value * torch.sigmoid(gate))


def _head_spec(group: Group) -> SymmetrySpec:
    uses = (
        Use("proj.weight", 0, "write", outer=2),
        Use("proj.bias", 0, "write", outer=2),
        Use("out.weight", 1, "read"),
    )
    return SymmetrySpec((Space("heads", 12, group, uses),))


def test_head_permutation_preserves_a_headed_net(outputs) -> None:
    torch.manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = HeadNet(5, heads=4, head_dim=3, d_out=2)
    params = {k: v.detach().clone() for k, v in net.state_dict().items()}
    x = torch.randn(7, 5, generator=_gen(1))
    spec = _head_spec(HeadPermutation(heads=4, head_dim=3))
    transform = random_transform(spec, 3)
    assert not torch.equal(transform["heads"], torch.arange(4))
    _assert_same_function(outputs, net, params, net, apply(spec, params, transform), x)
    # control: a unit permutation that splits heads changes the function
    bad = _head_spec(Permutation())
    moved = apply(bad, params, random_transform(bad, 3))
    assert not torch.allclose(outputs(net, moved, x), outputs(net, params, x), atol=1e-3)


def _linear_net(d_in: int, hidden: int, d_out: int, seed: int) -> tuple[nn.Module, Params]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(d_in, hidden), nn.Linear(hidden, d_out))
    return net, {k: v.detach().clone() for k, v in net.state_dict().items()}


def _linear_spec(n: int, group: Group) -> SymmetrySpec:
    uses = (Use("0.weight", 0, "write"), Use("0.bias", 0, "write"), Use("1.weight", 1, "read"))
    return SymmetrySpec((Space("hidden", n, group, uses),))


@pytest.mark.parametrize("group", [Orthogonal(), Invertible()], ids=["orth", "inv"])
def test_continuous_groups_preserve_a_linear_net(outputs, group: Group) -> None:
    net, params = _linear_net(5, 6, 3, seed=0)
    spec = _linear_spec(6, group)
    transform = random_transform(spec, 4)
    moved = apply(spec, params, transform)
    assert not torch.allclose(moved["0.weight"], params["0.weight"])
    x = torch.randn(9, 5, generator=_gen(2))
    _assert_same_function(outputs, net, params, net, moved, x)
    back = apply(spec, moved, transform.inverse())
    torch.testing.assert_close(back["1.weight"], params["1.weight"], atol=1e-5, rtol=1e-5)


def test_a_bfloat16_parameter_is_permuted_in_its_own_dtype_without_a_float32_copy(
    monkeypatch,
) -> None:
    _, params = _linear_net(5, 6, 3, seed=0)
    low = {k: v.to(torch.bfloat16) for k, v in params.items()}
    spec = _linear_spec(6, Permutation())
    transform = random_transform(spec, 4)
    widened: list[torch.dtype] = []
    original = torch.Tensor.to

    def spy(self, *args, **kwargs):  # record every conversion apply makes
        widened.append(args[0] if args and isinstance(args[0], torch.dtype) else None)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    moved = apply(spec, low, transform)
    monkeypatch.undo()
    assert torch.float32 not in widened
    perm = transform[spec.names[0]]
    assert torch.equal(moved["0.weight"], low["0.weight"][perm])  # exact: entries gathered
    assert torch.equal(moved["1.weight"], low["1.weight"][:, perm])


def test_a_bfloat16_parameter_is_rotated_in_float32_and_rounded_once() -> None:
    _, params = _linear_net(5, 6, 3, seed=0)
    low = {k: v.to(torch.bfloat16) for k, v in params.items()}
    spec = _linear_spec(6, Orthogonal())
    transform = random_transform(spec, 4)
    moved = apply(spec, low, transform)
    wide = apply(spec, {k: v.float() for k, v in low.items()}, transform)
    for k in low:
        assert moved[k].dtype == torch.bfloat16
        assert torch.equal(moved[k], wide[k].to(torch.bfloat16)), k


def test_moved_params_are_checked_when_made_and_computed_when_read() -> None:
    _, params = _linear_net(5, 6, 3, seed=0)
    low = {k: v.to(torch.bfloat16) for k, v in params.items()}
    spec = _linear_spec(6, Orthogonal())
    transform = random_transform(spec, 4)
    moved = MovedParams(spec, low, transform)
    # shapes and stored dtypes without computing; each tensor as apply computes it
    assert {k: (v.shape, v.dtype) for k, v in layout(moved).items()} == {
        k: (v.shape, v.dtype) for k, v in low.items()
    }
    whole = apply(spec, low, transform)
    assert all(torch.equal(moved[k], whole[k]) for k in low)
    # a transform that does not fit is refused when the view is made, as apply refuses it
    spec5, _ = _mlp_spec(5)
    with pytest.raises(ValueError, match=r"expects axis 0 of 'layers.0.weight' to have size 5"):
        MovedParams(spec5, _mlp_spec(64)[1], random_transform(spec5, 0))


def test_rectangular_orthogonal_embeds_a_narrow_linear_net(outputs) -> None:
    narrow, params = _linear_net(5, 4, 3, seed=1)
    wide, _ = _linear_net(5, 9, 3, seed=2)
    spec = _linear_spec(4, Orthogonal())
    wide_params = apply(spec, params, random_transform(spec, 5, widths={"hidden": 9}))
    assert wide_params["0.weight"].shape == (9, 5)
    assert wide_params["1.weight"].shape == (3, 9)
    x = torch.randn(11, 5, generator=_gen(3))
    _assert_same_function(outputs, narrow, params, wide, wide_params, x)


def test_semi_permutation_embeds_a_narrow_relu_net(outputs) -> None:
    narrow, params = create_model("mlp", seed=0, in_features=5, hidden=[4, 3], out_features=2)
    wide, _ = create_model("mlp", seed=0, in_features=5, hidden=[9, 7], out_features=2)
    spec = narrow.symmetry_spec().with_groups(
        **{"hidden.0": SemiPermutation(), "hidden.1": SemiPermutation()}
    )
    transform = random_transform(spec, 6, widths={"hidden.0": 9, "hidden.1": 7})
    wide_params = apply(spec, params, transform)
    assert wide_params["layers.1.weight"].shape == (7, 9)
    x = torch.randn(13, 5, generator=_gen(4))
    _assert_same_function(outputs, narrow, params, wide, wide_params, x)


def test_apply_is_pure_and_skips_unused_and_integer_tensors() -> None:
    module, params = create_model(
        "mlp", seed=0, in_features=4, hidden=[6], out_features=2, norm="batch"
    )
    before = {k: v.clone() for k, v in params.items()}
    spec = module.symmetry_spec()
    moved = apply(spec, params, random_transform(spec, 1))
    for k in params:
        assert torch.equal(params[k], before[k]), f"{k} was modified"
    assert moved["head.bias"] is params["head.bias"]  # no space touches it
    assert moved["norms.0.num_batches_tracked"] is params["norms.0.num_batches_tracked"]


def test_distance_to_identity() -> None:
    spec = _linear_spec(4, Permutation())
    assert distance_to_identity(spec, Transform.identity(spec)) == {"hidden": 0.0}
    swap = Transform(spec, {"hidden": torch.tensor([1, 0, 2, 3])})
    # two rows differ in two entries each: sqrt(4) / sqrt(4)
    assert distance_to_identity(spec, swap)["hidden"] == pytest.approx(1.0)


# --------------------------------------------------------------------------- spec errors


def test_validate_names_a_missing_parameter() -> None:
    _, params = _linear_net(5, 6, 3, seed=0)
    spec = SymmetrySpec((Space("hidden", 6, Permutation(), (Use("2.weight", 1, "read"),)),))
    with pytest.raises(ValueError, match="missing parameter '2.weight'"):
        spec.validate(params)


def test_validate_names_a_wrong_size() -> None:
    _, params = _linear_net(5, 6, 3, seed=0)
    with pytest.raises(ValueError, match="size 7, found 6"):
        _linear_spec(7, Permutation()).validate(params)
    bad_axis = SymmetrySpec((Space("h", 6, Permutation(), (Use("0.bias", 1, "write"),)),))
    with pytest.raises(ValueError, match="no axis 1"):
        bad_axis.validate(params)
    _linear_spec(6, Permutation()).validate(params)  # the right size passes


@pytest.mark.parametrize("group", [Orthogonal(), Invertible(), SemiPermutation()])
def test_elementwise_use_refused_by_mixing_groups(group: Group) -> None:
    params = {"w": torch.zeros(4, 3), "scale": torch.ones(4)}
    uses = (Use("w", 0, "write"), Use("scale", 0, "elementwise"))
    spec = SymmetrySpec((Space("s", 4, group, uses),))
    with pytest.raises(ValueError, match="elementwise parameter 'scale'"):
        spec.validate(params)
    with pytest.raises(ValueError, match="elementwise"):
        group.act(torch.ones(1, 4, 1), group.identity(4), "elementwise")


def test_duplicate_axis_use_and_space_names_are_refused() -> None:
    use = Use("w", 0, "write")
    with pytest.raises(ValueError, match="axis 0 of 'w' is used by both 'a' and 'b'"):
        SymmetrySpec((Space("a", 4, Permutation(), (use,)), Space("b", 4, Permutation(), (use,))))
    with pytest.raises(ValueError, match=r"duplicate space names: \['a'\]"):
        SymmetrySpec(
            (
                Space("a", 4, Permutation(), (Use("w", 0, "write"),)),
                Space("a", 4, Permutation(), (Use("w", 1, "read"),)),
            )
        )
    with pytest.raises(ValueError, match="no uses"):
        SymmetrySpec((Space("a", 4, Permutation(), ()),))
    with pytest.raises(ValueError, match="role"):
        Use("w", 0, "writes")  # type: ignore[arg-type]


def test_unknown_space_names_are_refused() -> None:
    spec = _linear_spec(4, Permutation())
    with pytest.raises(KeyError, match="unknown spaces"):
        Transform(spec, {"nope": torch.arange(4)})
    with pytest.raises(KeyError, match="unknown spaces"):
        Transform.identity(spec).replace(nope=torch.arange(4))
    with pytest.raises(KeyError, match="widths name unknown spaces"):
        random_transform(spec, 0, widths={"nope": 5})
    with pytest.raises(KeyError, match="no spaces named"):
        spec.with_groups(nope=Orthogonal())
    with pytest.raises(KeyError, match="spaces are"):
        spec["nope"]


def test_transform_of_another_spec_is_refused() -> None:
    _, params = _linear_net(5, 4, 3, seed=0)
    spec = _linear_spec(4, Permutation())
    other = SymmetrySpec((Space("other", 4, Permutation(), (Use("0.weight", 0, "write"),)),))
    with pytest.raises(ValueError, match="different spec"):
        apply(spec, params, Transform.identity(other))


def test_transform_compose_and_inverse_on_specs() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[5, 5], out_features=2)
    spec = module.symmetry_spec()
    first, second = random_transform(spec, 1), random_transform(spec, 2)
    both = apply(spec, apply(spec, params, first), second)
    composed = apply(spec, params, second.compose(first))
    for k in params:
        torch.testing.assert_close(composed[k], both[k])
    ident = first.inverse().compose(first)
    for name in spec.names:
        assert torch.equal(ident[name], torch.arange(5))


# --------------------------------------------------------------------------- apply checks


def _mlp_spec(width: int) -> tuple[SymmetrySpec, Params]:
    module, params = create_model("mlp", seed=0, in_features=5, hidden=[width], out_features=3)
    return module.symmetry_spec(), params


def test_a_transform_of_another_width_is_refused_naming_space_and_sizes() -> None:
    spec64, params64 = _mlp_spec(64)
    spec32, _ = _mlp_spec(32)
    narrow = random_transform(spec32, 0)
    with pytest.raises(ValueError) as info:
        apply(spec64, params64, narrow)
    message = str(info.value)
    assert message == (
        "transform for space 'hidden.0': Permutation element permutes 32 units, the space has 64"
    )
    # the spec and the transform agree, but the weights are wider than the spec says
    with pytest.raises(
        ValueError,
        match=r"'hidden.0' \(n=32\) expects axis 0 of 'layers.0.weight' to have size 32, found 64",
    ):
        apply(spec32, params64, narrow)


@pytest.mark.parametrize(
    ("group", "element", "message"),
    [
        (Permutation(), torch.tensor([0, 0, 1, 2, 3, 4]), "repeats an index"),
        (Orthogonal(), 2 * torch.eye(6), "not orthogonal"),
        (Invertible(), torch.zeros(6, 6), "singular"),
        (
            SemiPermutation(),
            SemiPermutationElement(torch.arange(6), torch.full((6,), 0.5), 6),
            "must sum to 1",
        ),
    ],
    ids=["perm", "orth", "inv", "semi"],
)
def test_a_hand_made_non_member_is_refused(group: Group, element: object, message: str) -> None:
    _, params = _linear_net(5, 6, 3, seed=0)
    spec = _linear_spec(6, group)
    with pytest.raises(ValueError, match=f"transform for space 'hidden': .*{message}"):
        apply(spec, params, Transform(spec, {"hidden": element}))


def test_rectangular_transforms_pass_the_checks() -> None:
    spec = _linear_spec(4, Orthogonal())
    _, params = _linear_net(5, 4, 3, seed=1)
    wide = apply(spec, params, random_transform(spec, 5, widths={"hidden": 9}))
    assert wide["0.weight"].shape == (9, 5)
