"""Symmetry algebra: group elements as matrices, function invariance of ``apply``, spec checks."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.models import create_model
from lmckit.params import Params
from lmckit.symmetry import (
    Group,
    HeadPermutation,
    Invertible,
    Orthogonal,
    Permutation,
    SemiPermutation,
    Space,
    SymmetrySpec,
    Transform,
    Use,
    apply,
    distance_to_identity,
    random_transform,
)

SQUARE_GROUPS: dict[str, tuple[Group, int]] = {
    "permutation": (Permutation(), 6),
    "permutation-blocks": (Permutation(blocks=3), 6),
    "heads": (HeadPermutation(heads=3, head_dim=2), 6),
    "semi-permutation": (SemiPermutation(), 6),
    "orthogonal": (Orthogonal(), 6),
    "invertible": (Invertible(), 6),
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mat(group: Group, element: object) -> Tensor:
    return group.matrix(element).double()


# --------------------------------------------------------------------------- group algebra


@pytest.mark.parametrize("name", SQUARE_GROUPS)
def test_inverse_times_element_is_identity(name: str) -> None:
    group, n = SQUARE_GROUPS[name]
    t = group.random(n, _gen(0))
    eye = torch.eye(n, dtype=torch.float64)
    inv = _mat(group, group.inverse(t))
    torch.testing.assert_close(inv @ _mat(group, t), eye, atol=1e-5, rtol=0)
    torch.testing.assert_close(_mat(group, t) @ inv, eye, atol=1e-5, rtol=0)
    torch.testing.assert_close(_mat(group, group.identity(n)), eye)


@pytest.mark.parametrize("name", SQUARE_GROUPS)
def test_compose_is_matrix_product(name: str) -> None:
    group, n = SQUARE_GROUPS[name]
    first, second = group.random(n, _gen(1)), group.random(n, _gen(2))
    product = _mat(group, second) @ _mat(group, first)
    torch.testing.assert_close(
        _mat(group, group.compose(second, first)), product, atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("name", SQUARE_GROUPS)
def test_reader_matrix_is_inverse_transpose(name: str) -> None:
    # readers are contracted with L^T where L T = I (T^{-T} for square elements)
    group, n = SQUARE_GROUPS[name]
    t = group.random(n, _gen(3))
    left = group.reader_matrix(t).double().T
    torch.testing.assert_close(
        left @ _mat(group, t), torch.eye(n, dtype=torch.float64), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("name", ["permutation", "permutation-blocks", "heads"])
def test_permutation_like_elements_are_permutation_matrices(name: str) -> None:
    group, n = SQUARE_GROUPS[name]
    mat = _mat(group, group.random(n, _gen(4)))
    assert set(mat.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(mat.sum(0), torch.ones(n, dtype=torch.float64))
    assert torch.equal(mat.sum(1), torch.ones(n, dtype=torch.float64))


def test_block_permutation_maps_blocks_onto_blocks() -> None:
    group = Permutation(blocks=4)
    for seed in range(5):
        perm = group.random(12, _gen(seed))
        # h'[i] = h[perm[i]]: the sources of each target block form one whole source block
        for block in perm.reshape(4, 3):
            assert len(set((block // 3).tolist())) == 1
    with pytest.raises(ValueError, match="blocks"):
        group.random(10, _gen(0))


def test_head_permutation_moves_whole_heads() -> None:
    group = HeadPermutation(heads=4, head_dim=3)
    mat = _mat(group, group.random(12, _gen(5)))
    # block (i, j) of the matrix is either 0 or the 3x3 identity
    blocks = mat.reshape(4, 3, 4, 3).permute(0, 2, 1, 3)
    for i in range(4):
        for j in range(4):
            b = blocks[i, j]
            assert torch.equal(b, torch.zeros(3, 3, dtype=torch.float64)) or torch.equal(
                b, torch.eye(3, dtype=torch.float64)
            )
    with pytest.raises(ValueError, match="heads"):
        group.random(10, _gen(0))


def test_orthogonal_and_invertible_elements() -> None:
    o = _mat(Orthogonal(), Orthogonal().random(5, _gen(6)))
    torch.testing.assert_close(o.T @ o, torch.eye(5, dtype=torch.float64), atol=1e-5, rtol=0)
    a = _mat(Invertible(), Invertible().random(5, _gen(7)))
    sv = torch.linalg.svdvals(a)
    # well conditioned by construction: singular values in [0.5, 2]
    assert float(sv.min()) >= 0.5 - 1e-5 and float(sv.max()) <= 2 + 1e-5


@pytest.mark.parametrize("group", [Orthogonal(), SemiPermutation()], ids=["orth", "semi"])
def test_rectangular_elements_have_left_inverses(group: Group) -> None:
    t = group.random(4, _gen(8), m=7)
    assert group.dims(t) == (7, 4)
    mat = _mat(group, t)
    assert mat.shape == (7, 4)
    left = group.reader_matrix(t).double().T
    torch.testing.assert_close(left @ mat, torch.eye(4, dtype=torch.float64), atol=1e-5, rtol=0)
    # composing embeddings 4 -> 7 -> 9 is the matrix product
    second = group.random(7, _gen(9), m=9)
    both = group.compose(second, t)
    torch.testing.assert_close(_mat(group, both), _mat(group, second) @ mat, atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        group.inverse(t)
    with pytest.raises(ValueError):
        group.random(7, _gen(0), m=4)


def test_semi_permutation_columns_sum_to_one() -> None:
    mat = _mat(SemiPermutation(), SemiPermutation().random(5, _gen(10), m=11))
    torch.testing.assert_close(mat.sum(0), torch.ones(5, dtype=torch.float64))
    assert torch.equal((mat > 0).sum(1), torch.ones(11, dtype=torch.long))


@pytest.mark.parametrize("group", [Permutation(), HeadPermutation(2, 3), Invertible()])
def test_square_groups_refuse_rectangular_draws(group: Group) -> None:
    with pytest.raises(ValueError, match="square"):
        group.random(6, _gen(0), m=8)


# --------------------------------------------------------------------------- function invariance


def _outputs(module: nn.Module, params: Params, x: Tensor) -> Tensor:
    module.eval()
    with torch.no_grad():
        return functional_call(module, params, (x,))


def _assert_same_function(
    module: nn.Module, params: Params, other: nn.Module, moved: Params, x: Tensor
) -> None:
    torch.testing.assert_close(
        _outputs(other, moved, x), _outputs(module, params, x), atol=1e-4, rtol=1e-4
    )


def test_transform_changes_params_but_not_mlp_function_with_block_permutations() -> None:
    module, params = create_model("mlp", seed=0, in_features=5, hidden=[8, 6], out_features=3)
    spec = module.symmetry_spec().with_groups(
        **{"hidden.0": Permutation(blocks=2), "hidden.1": Permutation(blocks=2)}
    )
    transform = random_transform(spec, 0)
    moved = apply(spec, params, transform)
    assert not torch.equal(moved["layers.0.weight"], params["layers.0.weight"])
    x = torch.randn(10, 5, generator=_gen(0))
    _assert_same_function(module, params, module, moved, x)
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


def test_head_permutation_preserves_a_headed_net() -> None:
    torch.manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = HeadNet(5, heads=4, head_dim=3, d_out=2)
    params = {k: v.detach().clone() for k, v in net.state_dict().items()}
    x = torch.randn(7, 5, generator=_gen(1))
    spec = _head_spec(HeadPermutation(heads=4, head_dim=3))
    transform = random_transform(spec, 3)
    assert not torch.equal(transform["heads"], torch.arange(4))
    _assert_same_function(net, params, net, apply(spec, params, transform), x)
    # control: a unit permutation that splits heads changes the function
    bad = _head_spec(Permutation())
    moved = apply(bad, params, random_transform(bad, 3))
    assert not torch.allclose(_outputs(net, moved, x), _outputs(net, params, x), atol=1e-3)


def _linear_net(d_in: int, hidden: int, d_out: int, seed: int) -> tuple[nn.Module, Params]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(d_in, hidden), nn.Linear(hidden, d_out))
    return net, {k: v.detach().clone() for k, v in net.state_dict().items()}


def _linear_spec(n: int, group: Group) -> SymmetrySpec:
    uses = (Use("0.weight", 0, "write"), Use("0.bias", 0, "write"), Use("1.weight", 1, "read"))
    return SymmetrySpec((Space("hidden", n, group, uses),))


@pytest.mark.parametrize("group", [Orthogonal(), Invertible()], ids=["orth", "inv"])
def test_continuous_groups_preserve_a_linear_net(group: Group) -> None:
    net, params = _linear_net(5, 6, 3, seed=0)
    spec = _linear_spec(6, group)
    transform = random_transform(spec, 4)
    moved = apply(spec, params, transform)
    assert not torch.allclose(moved["0.weight"], params["0.weight"])
    x = torch.randn(9, 5, generator=_gen(2))
    _assert_same_function(net, params, net, moved, x)
    back = apply(spec, moved, transform.inverse())
    torch.testing.assert_close(back["1.weight"], params["1.weight"], atol=1e-5, rtol=1e-5)


def test_rectangular_orthogonal_embeds_a_narrow_linear_net() -> None:
    narrow, params = _linear_net(5, 4, 3, seed=1)
    wide, _ = _linear_net(5, 9, 3, seed=2)
    spec = _linear_spec(4, Orthogonal())
    wide_params = apply(spec, params, random_transform(spec, 5, widths={"hidden": 9}))
    assert wide_params["0.weight"].shape == (9, 5)
    assert wide_params["1.weight"].shape == (3, 9)
    x = torch.randn(11, 5, generator=_gen(3))
    _assert_same_function(narrow, params, wide, wide_params, x)


def test_semi_permutation_embeds_a_narrow_relu_net() -> None:
    narrow, params = create_model("mlp", seed=0, in_features=5, hidden=[4, 3], out_features=2)
    wide, _ = create_model("mlp", seed=0, in_features=5, hidden=[9, 7], out_features=2)
    spec = narrow.symmetry_spec().with_groups(
        **{"hidden.0": SemiPermutation(), "hidden.1": SemiPermutation()}
    )
    transform = random_transform(spec, 6, widths={"hidden.0": 9, "hidden.1": 7})
    wide_params = apply(spec, params, transform)
    assert wide_params["layers.1.weight"].shape == (7, 9)
    x = torch.randn(13, 5, generator=_gen(4))
    _assert_same_function(narrow, params, wide, wide_params, x)


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
