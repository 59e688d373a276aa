"""Every zoo model's symmetry spec is exact: transforms leave the function unchanged.

Each registered model needs a small configuration in ``SMALL`` below; a model without
one fails :func:`test_function_invariant_under_random_transform` with a message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from tests.tiny_models import TINY
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.modules.batchnorm import _BatchNorm

from lmckit.models import ModelConfig, ZooModel, build_zoo_model, create_model, list_models
from lmckit.models._norms import CONV_NORMS, group_norm_groups
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import Permutation, Probe, Space, SymmetrySpec, Transform, apply

BATCH = 5


@dataclass(frozen=True)
class SmallConfig:
    """A tiny instance of a zoo model, and what the tests need to know about it."""

    kwargs: dict[str, Any]
    input_shape: tuple[int, ...]
    norms: tuple[str, ...]
    #: activation options; ``None`` where the model has no ``activation`` argument.
    activations: tuple[str | None, ...] = (None,)
    #: attention forms (transformers); ``None`` where the model has no attention.
    attentions: tuple[str | None, ...] = (None,)
    #: the weight whose axis 1 reads the data, and the weight/bias writing the logits.
    first_layer: str = ""
    classifier: str = "classifier"
    #: further data-side axes in no space: token/position rows, class-token singletons.
    data_axes: tuple[tuple[str, int], ...] = ()


SMALL: dict[str, SmallConfig] = {
    "mlp": SmallConfig(
        TINY["mlp"],
        (12,),
        ("none", "batch", "layer"),
        ("relu", "gelu"),
        first_layer="layers.0",
        classifier="head",
    ),
    "vgg": SmallConfig(
        TINY["vgg"],
        (1, 8, 8),
        CONV_NORMS,
        first_layer="features.0",
    ),
    "gpt2": SmallConfig(
        TINY["gpt2"],
        (6,),
        ("layer", "rms"),
        attentions=("heads", "circuits"),
        # tied: wte's rows are the tokens in and the logits out
        first_layer="transformer.wte",
        classifier="transformer.wte",
        data_axes=(("transformer.wpe.weight", 0),),
    ),
    "vit": SmallConfig(
        TINY["vit"],
        (1, 8, 8),
        ("layer", "rms"),
        attentions=("heads", "circuits"),
        first_layer="vit.embeddings.patch_embeddings.projection",
        data_axes=(
            ("vit.embeddings.cls_token", 0),
            ("vit.embeddings.cls_token", 1),
            ("vit.embeddings.position_embeddings", 0),
            ("vit.embeddings.position_embeddings", 1),
        ),
    ),
    "resnet20": SmallConfig(
        TINY["resnet20"],
        (1, 8, 8),
        CONV_NORMS,
        first_layer="stem_conv",
    ),
}


@dataclass
class Case:
    name: str
    norm: str
    activation: str | None
    module: ZooModel
    params: Params
    spec: SymmetrySpec
    inputs: Tensor
    config: SmallConfig = field(repr=False)


def _cases(*, models: tuple[str, ...] | None = None, norms: tuple[str, ...] | None = None):
    out = []
    for name in list_models():
        if models is not None and name not in models:
            continue
        config = SMALL.get(name)
        if config is None:
            out.append(pytest.param(name, "", None, None, id=f"{name}-no-small-config"))
            continue
        for norm in config.norms:
            if norms is not None and norm not in norms:
                continue
            for act in config.activations:
                for attention in config.attentions:
                    ident = "-".join(p for p in (name, norm, act, attention) if p)
                    out.append(pytest.param(name, norm, act, attention, id=ident))
    return out


def _randomise_norms(module: nn.Module, params: Params, seed: int) -> None:
    """Random affine parameters and (positive) running statistics for every norm layer."""
    gen = torch.Generator().manual_seed(seed)
    norms = {
        name
        for name, m in module.named_modules()
        if isinstance(m, _BatchNorm | nn.GroupNorm | nn.LayerNorm)
    }
    for key, value in params.items():
        owner, _, leaf = key.rpartition(".")
        if owner not in norms or not value.is_floating_point():
            continue
        noise = torch.randn(value.shape, generator=gen)
        if leaf == "running_var":
            params[key] = 0.5 + 1.5 * torch.rand(value.shape, generator=gen)
        elif leaf == "weight":
            params[key] = 1.0 + 0.5 * noise
        else:  # bias, running_mean
            params[key] = 0.5 * noise


def _build(
    name: str, norm: str, activation: str | None, attention: str | None, *, seed: int = 0
) -> Case:
    config = SMALL.get(name)
    if config is None:
        pytest.fail(f"model {name!r} has no small configuration in tests/models/test_zoo.py")
    kwargs = dict(config.kwargs, norm=norm)
    if activation is not None:
        kwargs["activation"] = activation
    if attention is not None:
        kwargs["attention"] = attention
    module, params = create_model(name, seed=seed, **kwargs)
    module.eval()
    _randomise_norms(module, params, seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    if name == "gpt2":  # token ids
        vocab = config.kwargs["vocab_size"]
        inputs = torch.randint(0, vocab, (BATCH, *config.input_shape), generator=gen)
    else:
        inputs = torch.randn(BATCH, *config.input_shape, generator=gen)
    return Case(name, norm, activation, module, params, module.symmetry_spec(), inputs, config)


def _logits(case: Case, params: Params) -> Tensor:
    with torch.no_grad():
        return functional_call(case.module, params, (case.inputs,))


def _rel_err(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))


def _assert_params_equal(a: Params, b: Params, *, exact: bool = True) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), key
        else:  # orthogonal maps are exact only to rounding
            assert torch.allclose(a[key], b[key], atol=1e-5, rtol=1e-5), key


def _moves_units(spec: SymmetrySpec) -> bool:
    """Whether every group only moves units (permutations), so transforms are exact."""
    return all(s.group.elementwise_ok for s in spec)


# --------------------------------------------------------------------------- invariance


@pytest.mark.parametrize(("name", "norm", "activation", "attention"), _cases())
def test_function_invariant_under_random_transform(
    name: str, norm: str, activation: str | None, attention: str | None
) -> None:
    case = _build(name, norm, activation, attention)
    case.spec.validate(case.params)
    transform = random_transform(case.spec, seed=123)
    moved = apply(case.spec, case.params, transform)
    case.spec.validate(moved)
    assert any(not torch.equal(case.params[k], moved[k]) for k in case.params), "no-op"
    before, after = _logits(case, case.params), _logits(case, moved)
    assert _rel_err(before, after) <= 1e-4


@pytest.mark.parametrize(("name", "norm", "activation", "attention"), _cases())
def test_inverse_and_composition_are_exact(
    name: str, norm: str, activation: str | None, attention: str | None
) -> None:
    case = _build(name, norm, activation, attention)
    first = random_transform(case.spec, seed=1)
    second = random_transform(case.spec, seed=2)
    moved = apply(case.spec, case.params, first)
    exact = _moves_units(case.spec)
    _assert_params_equal(apply(case.spec, moved, first.inverse()), case.params, exact=exact)
    _assert_params_equal(
        apply(case.spec, case.params, second.compose(first)),
        apply(case.spec, moved, second),
        exact=exact,
    )


@pytest.mark.parametrize(("name", "norm", "activation", "attention"), _cases())
def test_writer_only_permutation_changes_function(
    name: str, norm: str, activation: str | None, attention: str | None
) -> None:
    """Negative control: permuting a writer but not its readers must be detected."""
    case = _build(name, norm, activation, attention)
    space = case.spec.spaces[0]
    writes_only = Space(
        space.name, space.n, Permutation(), tuple(u for u in space.uses if u.role == "write")
    )
    broken = SymmetrySpec((writes_only,))
    flip = Transform(broken, {space.name: torch.arange(space.n).flip(0)})
    moved = apply(broken, case.params, flip)
    assert _rel_err(_logits(case, case.params), _logits(case, moved)) > 1e-3


@pytest.mark.parametrize(("name", "norm", "activation", "attention"), _cases())
def test_probes_move_with_their_space(
    name: str, norm: str, activation: str | None, attention: str | None
) -> None:
    """A probe's output, permuted by the space's element, equals the moved model's."""
    case = _build(name, norm, activation, attention)
    # spaces nested inside heads have no probe (activation matching solves them from the
    # weights once the heads are matched): they stay put, so a probe sees its space alone
    drawn = random_transform(case.spec, seed=7)
    transform = Transform(case.spec, {s.name: drawn[s.name] for s in case.spec if s.nest is None})
    moved = apply(case.spec, case.params, transform)
    modules = dict(case.module.named_modules())
    for space in (s for s in case.spec if s.nest is None):
        assert space.probes, f"space {space.name} has no probe"
        for probe in space.probes:
            assert probe.module in modules, probe
            seen = [_probe_output(case, params, probe) for params in (case.params, moved)]
            assert seen[0].shape[probe.axis] == space.n, probe
            # h' = T h along the probe's axis (an index map for permutations)
            mat = space.group.matrix(transform[space.name]).to(seen[0].dtype)
            want = (seen[0].movedim(probe.axis, -1) @ mat.T).movedim(-1, probe.axis)
            assert _rel_err(want, seen[1]) <= 1e-4, (space.name, probe)


def _probe_output(case: Case, params: Params, probe: Probe) -> Tensor:
    """What the probe observes: its module's output, or its input (``probe.input``)."""
    outputs: list[Tensor] = []
    module = case.module.get_submodule(probe.module)
    if probe.input:
        handle = module.register_forward_pre_hook(lambda _m, args: outputs.append(args[0]))
    else:
        handle = module.register_forward_hook(lambda _m, _i, out: outputs.append(out.detach()))
    try:
        _logits(case, params)
    finally:
        handle.remove()
    assert len(outputs) == 1, f"{probe.module} ran {len(outputs)} times"
    return outputs[0]


# --------------------------------------------------------------------------- coverage


@pytest.mark.parametrize(("name", "norm", "activation", "attention"), _cases())
def test_spec_covers_every_hidden_axis(
    name: str, norm: str, activation: str | None, attention: str | None
) -> None:
    """Every float tensor's channel axes are in a space, except data input and logits."""
    case = _build(name, norm, activation, attention)
    first, head = case.config.first_layer, case.config.classifier
    exempt = {(f"{first}.weight", 1), (f"{head}.weight", 0), (f"{head}.bias", 0)}
    if first == head:  # tied embedding: axis 0 is the tokens, axis 1 the residual stream
        exempt = {(f"{head}.weight", 0)}
    exempt |= set(case.config.data_axes)
    covered = {(u.param, u.axis % case.params[u.param].ndim) for s in case.spec for u in s.uses}
    for key, value in case.params.items():
        if not value.is_floating_point():
            continue
        for axis in range(min(value.ndim, 2)):  # conv kernels' spatial axes are not spaces
            if (key, axis) in exempt:
                assert (key, axis) not in covered, f"{key} axis {axis} is data/logits"
            else:
                assert (key, axis) in covered, f"{key} axis {axis} is in no space"
    assert all(k in case.params for k, _ in exempt if not k.endswith("bias")), exempt


@pytest.mark.parametrize(("name", "norm", "activation", "attention"), _cases())
def test_repair_sites_write_a_space(
    name: str, norm: str, activation: str | None, attention: str | None
) -> None:
    case = _build(name, norm, activation, attention)
    sites = case.module.repair_sites()
    assert sites and len(set(sites)) == len(sites)
    writes = {
        u.param: s
        for s in case.spec
        for u in s.uses
        if u.role in ("write", "elementwise") and u.axis == 0
    }
    for site in sites:
        module = case.module.get_submodule(site)
        space = writes.get(f"{site}.weight")
        assert space is not None, f"{site} writes no space"
        assert module.weight.shape[0] == space.n
        if norm == "none":
            assert module.bias is not None, f"{site} needs a bias to fold REPAIR into"


# --------------------------------------------------------------------------- group norm


def _blocked_spaces(spec: SymmetrySpec) -> Iterator[Space]:
    for space in spec:
        group = space.group
        if isinstance(group, Permutation) and 1 < group.blocks < space.n:
            yield space


@pytest.mark.parametrize(("name", "norm", "activation", "attention"), _cases(norms=("group",)))
def test_group_norm_needs_blocked_permutations(
    name: str, norm: str, activation: str | None, attention: str | None
) -> None:
    case = _build(name, norm, activation, attention)
    spaces = list(_blocked_spaces(case.spec))
    assert spaces, "the small config has no group-norm space with several channels per group"
    before = _logits(case, case.params)
    for space in spaces:
        assert space.group.blocks == group_norm_groups(space.n)
        blocked = Transform(case.spec, {space.name: random_transform(case.spec, 5)[space.name]})
        assert _rel_err(before, _logits(case, apply(case.spec, case.params, blocked))) <= 1e-4
        # shifting every channel by one straddles the groups
        free = case.spec.with_groups(**{space.name: Permutation()})
        shift = Transform(free, {space.name: torch.roll(torch.arange(space.n), -1)})
        after = _logits(case, apply(free, case.params, shift))
        assert _rel_err(before, after) > 1e-3, space.name


# --------------------------------------------------------------------------- models


def test_all_zoo_models_have_a_small_config() -> None:
    assert set(list_models()) >= {"mlp", "vgg", "resnet20"}
    missing = set(list_models()) - set(SMALL)
    assert not missing, f"add small configs for {sorted(missing)}"


@pytest.mark.parametrize("image_size", [8, 28, 32])
def test_vgg_skips_pools_on_small_images(image_size: int) -> None:
    module, params = create_model(
        "vgg", in_channels=3, num_classes=10, image_size=image_size, width_mult=1 / 32
    )
    module.eval()
    n_pools = sum(isinstance(m, nn.MaxPool2d) for m in module.features)
    assert n_pools == {8: 3, 28: 4, 32: 5}[image_size]
    out = module(torch.randn(2, 3, image_size, image_size))
    assert out.shape == (2, 10)
    spec = module.symmetry_spec()
    spec.validate(params)
    # VGG11: 8 convolutions of 64, 128, 256, 256, 512, 512, 512, 512 channels / 32
    assert [s.n for s in spec] == [2, 4, 8, 8, 16, 16, 16, 16]


def test_vgg_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="norm"):
        create_model("vgg", in_channels=1, num_classes=2, image_size=8, norm="instance")
    with pytest.raises(ValueError, match="widths"):
        create_model("vgg", in_channels=1, num_classes=2, image_size=8, widths=["M"])
    with pytest.raises(ValueError, match="widths"):
        create_model("vgg", in_channels=1, num_classes=2, image_size=8, widths=[4, "P"])


@pytest.mark.parametrize("width_mult", [1, 2])
def test_resnet20_layout(width_mult: int) -> None:
    module, params = create_model("resnet20", in_channels=3, num_classes=10, width_mult=width_mult)
    convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
    shortcut_convs = [m for m in convs if m.kernel_size == (1, 1)]
    assert len(convs) - len(shortcut_convs) + 1 == 20  # 19 convs and the Linear
    assert len(shortcut_convs) == 2
    spec = module.symmetry_spec()
    spec.validate(params)
    k = width_mult
    assert [spec[f"residual.{s}"].n for s in range(3)] == [16 * k, 32 * k, 64 * k]
    assert len(spec) == 3 + 9
    stage1 = spec["residual.1"]
    assert {"stages.1.0.shortcut.conv.weight", "stages.1.0.conv2.weight"} <= set(stage1.params)
    assert "stages.2.0.shortcut.conv.weight" in stage1.params  # read by the next stage
    assert "classifier.weight" in spec["residual.2"].params
    # probes are the inputs of the layers reading a stage: its blocks' first convs, the
    # next stage's first conv and shortcut (or the classifier)
    readers = [[p.module for p in spec[f"residual.{s}"].probes] for s in range(3)]
    assert readers[0] == [f"stages.0.{b}.conv1" for b in range(3)] + [
        "stages.1.0.conv1",
        "stages.1.0.shortcut.conv",
    ]
    assert readers[2] == ["stages.2.1.conv1", "stages.2.2.conv1", "classifier"]
    out = module.eval()(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_group_norm_groups_divide_channels() -> None:
    assert [group_norm_groups(c) for c in (1, 4, 12, 16, 64, 7)] == [1, 4, 6, 8, 8, 7]


@pytest.mark.parametrize("name", ["vgg", "resnet20"])
def test_config_round_trips_through_json(name: str) -> None:
    kwargs = dict(SMALL[name].kwargs, norm="group")
    module, params = create_model(name, seed=3, **kwargs)
    rebuilt = build_zoo_model(ModelConfig.from_json(module.config.to_json()))
    assert rebuilt.state_dict().keys() == params.keys()
    assert dataclasses.asdict(rebuilt.config) == dataclasses.asdict(module.config)
    rebuilt.symmetry_spec().validate(params)
