"""Symmetry inference on models users write themselves, and what it must refuse."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.aligners import weight_matching
from lmckit.groups import Orthogonal, Permutation
from lmckit.inference import (
    SpecCheckError,
    SpecInferenceError,
    analyze_symmetries,
    check_spec,
    infer_spec,
)
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import module_params
from lmckit.symmetry._transform import Space, SymmetrySpec, apply


def _sequential_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 3)
    )


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class ResidualCNN(nn.Module):
    """Conv stem, two residual blocks with BatchNorm, then Flatten -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 6, 3, padding=1)
        self.blocks = nn.Sequential(Block(6), Block(6))
        self.pool = nn.AvgPool2d(2)
        self.head = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.pool(self.blocks(self.stem(x))).flatten(1))


def _randomised_bn(module: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):  # non-trivial statistics, so forgetting them shows
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)


def _cnn() -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    module = ResidualCNN()
    _randomised_bn(module, 1)
    return module, torch.randn(3, 1, 8, 8)


def _out(module: nn.Module, params: dict, x: Tensor) -> Tensor:
    with torch.no_grad():
        return functional_call(module.eval(), params, (x,))


def test_sequential_mlp_gets_a_permutation_per_hidden_layer() -> None:
    module = _sequential_mlp()
    spec = infer_spec(module, (torch.randn(4, 12),))
    assert [(s.name, s.n, type(s.group)) for s in spec] == [
        ("0", 16, Permutation),
        ("2", 16, Permutation),
    ]
    assert {(u.param, u.axis, u.role) for u in spec["0"].uses} == {
        ("0.weight", 0, "write"),
        ("0.bias", 0, "write"),
        ("2.weight", 1, "read"),
    }


def test_a_linear_chain_without_nonlinearity_admits_rotations() -> None:
    module = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    spec = infer_spec(module, (torch.randn(3, 6),))
    assert isinstance(spec["0"].group, Orthogonal)  # Linear -> Linear: any rotation
    assert isinstance(spec["1"].group, Permutation)  # tanh acts unit by unit


def test_residual_cnn_spaces_follow_the_graph() -> None:
    module, x = _cnn()
    spec = infer_spec(module, (x,))
    stream = spec["residual"]  # stem and both blocks' conv2/bn2 write it
    writers = {u.param for u in stream.uses if u.role == "write"}
    assert writers == {"stem.weight", "stem.bias", "blocks.0.conv2.weight", "blocks.1.conv2.weight"}
    stats = {u.param: u.compare for u in stream.uses if "running" in u.param}
    assert stats and not any(stats.values())  # statistics move but are not compared
    flat = next(u for u in stream.uses if u.param == "head.weight")
    assert (flat.axis, flat.inner) == (1, 16)  # Conv -> Flatten -> Linear: 4x4 per channel
    assert sorted(s.name for s in spec) == ["blocks.0.conv1", "blocks.1.conv1", "residual"]


@pytest.mark.parametrize("build", [_sequential_mlp, lambda: _cnn()[0]], ids=["mlp", "cnn"])
def test_weight_matching_recovers_a_planted_permutation(build) -> None:
    module = build()
    x = torch.randn(4, 12) if isinstance(module, nn.Sequential) else torch.randn(3, 1, 8, 8)
    spec = infer_spec(module, (x,))
    a = module_params(module)
    b = apply(spec, a, random_transform(spec, seed=3))
    assert any(not torch.equal(a[k], b[k]) for k in a)
    torch.testing.assert_close(_out(module, b, x), _out(module, a, x), atol=1e-5, rtol=1e-5)
    moved = apply(spec, b, weight_matching(spec, a, b).transform)
    for key in a:
        torch.testing.assert_close(moved[key], a[key], atol=1e-6, rtol=0)


def _without(spec: SymmetrySpec, space: str, param: str) -> SymmetrySpec:
    s = spec[space]
    kept = tuple(u for u in s.uses if u.param != param)
    return SymmetrySpec(
        tuple(Space(x.name, x.n, x.group, kept if x is s else x.uses) for x in spec)
    )


@pytest.mark.parametrize(
    ("space", "param"),
    [("blocks.0.conv1", "blocks.0.bn1.running_mean"), ("residual", "stem.bias")],
)
def test_check_spec_names_the_space_and_the_missing_parameter(space: str, param: str) -> None:
    module, x = _cnn()
    spec = infer_spec(module, (x,))
    broken = _without(spec, space, param)
    with pytest.raises(SpecCheckError) as err:
        check_spec(module, broken, (x,))
    message = str(err.value)
    assert f"space {space!r}" in message and repr(param) in message and "omits" in message
    assert "\n" not in message


def test_check_spec_rejects_a_group_the_graph_does_not_allow() -> None:
    module = _sequential_mlp()
    spec = infer_spec(module, (torch.randn(4, 12),))
    rotated = spec.with_groups(**{"0": Orthogonal()})  # ReLU does not commute with rotations
    with pytest.raises(SpecCheckError, match=r"space '0' \(Orthogonal.*allows Permutation"):
        check_spec(module, rotated, (torch.randn(4, 12),))


def test_check_spec_accepts_the_inferred_spec_to_float64_precision() -> None:
    module, x = _cnn()
    errors = check_spec(module, infer_spec(module, (x,)), (x,))
    assert errors["all"] < 1e-10


def test_a_large_model_is_checked_in_float32_module_by_module(monkeypatch) -> None:
    import lmckit.inference._check as check

    module = _sequential_mlp().to(torch.bfloat16)
    x = torch.randn(4, 12)
    small = check.FunctionCheck(module, (x,))
    assert small.scale == 1.0 and small.params["0.weight"].dtype == torch.float64
    monkeypatch.setattr(check, "FLOAT64_CHECK_BYTES", 1000)  # the model is "large"
    large = check.FunctionCheck(module, (x,))
    assert large.scale == 1e3
    # each module computes in float32 on its own weights cast when it runs: the outputs
    # of a whole float32 copy, exactly
    whole = {k: v.float() for k, v in module_params(module).items()}
    (expected,) = [functional_call(module, whole, (x,))]
    assert torch.equal(large.reference[0], expected)
    assert module.get_parameter("0.weight").dtype == torch.bfloat16  # the module is as it was
    # it still tells a symmetry from what is not one, and a rejected element leaves the
    # parameters as they were
    spec = infer_spec(module, (x,))
    assert large.random_error(spec, spec.names, seed=0) < 1e-5
    rotated = spec.with_groups(**{"0": Orthogonal()})
    assert large.random_error(rotated, ["0"], seed=0, keep_within=1e-2) > 1e-2
    assert large.repeat_error() == 0.0
    with pytest.raises(SpecCheckError, match=r"space '0'"):
        check_spec(module, rotated, (x,))


class ReadsAnotherModulesWeight(nn.Module):
    """The output layer reuses the input layer's weight, read outside its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 10)
        self.mid = nn.Linear(10, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.mid(torch.relu(self.inp(x))))
        return h @ self.inp.weight


def test_a_module_reading_another_modules_weight_is_checked_on_a_whole_copy(
    monkeypatch,
) -> None:
    import lmckit.inference._check as check

    torch.manual_seed(0)
    module = ReadsAnotherModulesWeight()
    x = torch.randn(4, 6)
    monkeypatch.setattr(check, "FLOAT64_CHECK_BYTES", 100)
    large = check.FunctionCheck(module, (x,))
    assert torch.equal(large.reference[0], module(x))
    spec = infer_spec(module, (x,))
    assert spec.names == ("inp",)  # hidden units of both layers, tied by inp.weight
    assert large.random_error(spec, spec.names, seed=0) < 1e-5
    assert large.random_error(spec.with_groups(inp=Orthogonal()), ["inp"], seed=0) > 1e-2


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        if x.sum() > 0:  # control flow on values: export cannot trace it
            return self.fc(x)
        return x


def test_a_model_that_does_not_trace_is_a_one_line_error() -> None:
    fragment = r"^cannot trace DataDependent on a tensor \(2, 4\): "
    with pytest.raises(SpecInferenceError, match=fragment) as err:
        infer_spec(DataDependent(), (torch.randn(2, 4),))
    assert "\n" not in str(err.value)


class SortsFeatures(nn.Module):
    """A hidden layer whose units are sorted: no permutation commutes with that."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.sort(self.a(x), dim=-1).values
        return self.c(torch.relu(self.b(h)))


def test_an_op_the_rules_do_not_understand_is_left_out_and_reported() -> None:
    analysis = analyze_symmetries(SortsFeatures(), (torch.randn(3, 4),))
    assert analysis.spec.names == ("b",)  # a's units are sorted; b's are free to move
    assert any("sort" in line for line in analysis.left_out)
    assert "left out:" in analysis.report()


def test_a_decoder_that_returns_its_cache_by_default_is_traced_without_it() -> None:
    # transformers decoders return a key-value cache unless told not to; export cannot
    # flatten it, and it is state for the next call, not part of the function
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=23, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    assert model.config.use_cache
    x = torch.randint(0, 23, (2, 8))
    spec = infer_spec(model, x)
    assert "residual" in spec.names and any(name.startswith("heads.") for name in spec.names)
    assert max(check_spec(model, spec, x).values()) < 1e-4
    assert model.config.use_cache  # the user's model is left as it was
