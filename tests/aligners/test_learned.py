"""Learned matching: straight-through projections, dense apply, and loss-driven alignment."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.aligners import LearnedMatchingConfig, learned_matching, weight_matching
from lmckit.aligners._dense import reader_matrices
from lmckit.aligners._learned import apply_dense, sinkhorn, validation_split
from lmckit.data import Dataset, batches
from lmckit.groups import Scaling
from lmckit.measure._evaluate import evaluate_path
from lmckit.models import create_model
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import (
    Invertible,
    Nest,
    Orthogonal,
    Permutation,
    SemiPermutation,
    Space,
    SymmetrySpec,
    Transform,
    Use,
    apply,
)

FAST = LearnedMatchingConfig(steps=60, eval_every=10, patience=3, lr=0.02)


class TinyResidual(nn.Module):
    """``x -> embed -> (+ fc2 relu fc1) -> head``: a linear residual stream of width d."""

    def __init__(self, d_in: int = 64, d: int = 12, hidden: int = 16, out: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.head = nn.Linear(d, out)
        self.d, self.hidden = d, hidden

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x.flatten(1))
        h = h + self.fc2(torch.relu(self.fc1(h)))
        return self.head(h)

    def spec(self, residual: object) -> SymmetrySpec:
        res = Space(
            "residual",
            self.d,
            residual,
            (
                Use("embed.weight", 0, "write"),
                Use("embed.bias", 0, "write"),
                Use("fc2.weight", 0, "write"),
                Use("fc2.bias", 0, "write"),
                Use("fc1.weight", 1, "read"),
                Use("head.weight", 1, "read"),
            ),
        )
        hid = Space(
            "hidden",
            self.hidden,
            Permutation(),
            (
                Use("fc1.weight", 0, "write"),
                Use("fc1.bias", 0, "write"),
                Use("fc2.weight", 1, "read"),
            ),
        )
        return SymmetrySpec((res, hid))


class TinyGated(nn.Module):
    """``x -> embed -> (+ down (relu(gate h) * up h)) -> head``: a gated MLP whose up
    branch admits a positive scale per unit."""

    def __init__(self, d_in: int = 64, d: int = 12, hidden: int = 16, out: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.gate = nn.Linear(d, hidden)
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)
        self.head = nn.Linear(d, out)
        self.hidden = hidden

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x.flatten(1))
        h = h + self.down(torch.relu(self.gate(h)) * self.up(h))
        return self.head(h)

    def spec(self) -> SymmetrySpec:
        branch = ("up.weight", "up.bias")
        units = Space(
            "hidden",
            self.hidden,
            Permutation(),
            (
                *(Use(p, 0, "write") for p in ("gate.weight", "gate.bias", *branch)),
                Use("down.weight", 1, "read"),
            ),
        )
        scale = Space(
            "hidden.scale",
            self.hidden,
            Scaling(),
            (*(Use(p, 0, "write") for p in branch), Use("down.weight", 1, "read")),
            nest=Nest("hidden", None, "scale"),
        )
        return SymmetrySpec((units, scale))


def _params(module: nn.Module, seed: int) -> Params:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for p in module.parameters():
            nn.init.normal_(p, std=0.3)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _mid_loss(model: nn.Module, a: Params, b: Params, data: Dataset) -> float:
    return evaluate_path(
        model, a, b, lambda: batches(data.x_test, data.y_test, 500), ts=[0.0, 0.5, 1.0]
    ).loss[1]


@pytest.mark.parametrize(
    ("name", "kwargs", "shape"),
    [
        ("mlp", {"in_features": 6, "hidden": [5, 7], "out_features": 3, "norm": "batch"}, (6,)),
        (
            "vgg",
            {"in_channels": 2, "num_classes": 3, "image_size": 8, "widths": [4, "M", 6]},
            (2, 8, 8),
        ),
        (  # circuit heads: the residual acts on both axes of each circuit
            "gpt2",
            {"vocab_size": 9, "n_layer": 1, "n_head": 2, "n_embd": 8, "context": 4}
            | {"norm": "rms", "tie_embeddings": False, "attention": "circuits"},
            (4,),
        ),
    ],
)
def test_dense_apply_of_hard_matrices_equals_apply(name: str, kwargs: dict, shape: tuple) -> None:
    model, params = create_model(name, seed=0, **kwargs)
    spec = model.symmetry_spec()
    t = random_transform(spec, 3)
    mats = {s.name: s.group.matrix(t[s.name]).float() for s in spec}
    dense = apply_dense(spec, params, mats)
    exact = apply(spec, params, t)
    for k in exact:
        torch.testing.assert_close(dense[k], exact[k], rtol=0, atol=1e-6)


def test_dense_apply_of_orthogonal_map_preserves_function() -> None:
    module = TinyResidual()
    params = _params(module, 0)
    spec = module.spec(Orthogonal())
    o = Orthogonal().random(12, torch.Generator().manual_seed(1))
    moved = apply_dense(spec, params, {"residual": o})
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(
        functional_call(module, moved, (x,)),
        functional_call(module, params, (x,)),
        atol=1e-4,
        rtol=0,
    )


def test_dense_apply_moves_readers_by_the_inverse_transpose() -> None:
    module = TinyResidual()
    params = _params(module, 0)
    spec = module.spec(Invertible())
    m = Invertible().random(12, torch.Generator().manual_seed(1))
    mats = {"residual": m}
    moved = apply_dense(spec, params, mats, reader_matrices(spec, mats))
    exact = apply(spec, params, Transform(spec, mats))
    for k in exact:
        torch.testing.assert_close(moved[k], exact[k], rtol=0, atol=1e-5)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(
        functional_call(module, moved, (x,)),
        functional_call(module, params, (x,)),
        atol=1e-4,
        rtol=0,
    )
    # self-dual groups need no reader matrix
    assert reader_matrices(module.spec(Orthogonal()), mats) == {}


def test_sinkhorn_is_doubly_stochastic_and_sharpens_to_the_argmax() -> None:
    logits = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
    p = sinkhorn(logits, 50)
    torch.testing.assert_close(p.sum(0), torch.ones(6), atol=1e-5, rtol=0)
    torch.testing.assert_close(p.sum(1), torch.ones(6), atol=1e-5, rtol=0)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(1))
    sharp = sinkhorn(torch.eye(6)[perm] / 0.01, 20)
    torch.testing.assert_close(sharp, torch.eye(6)[perm], atol=1e-6, rtol=0)


def test_validation_split_holds_out_the_end_of_train(digits: Dataset) -> None:
    (xt, yt), (xv, yv) = validation_split(digits, 0.25)
    n = digits.x_train.shape[0]
    assert xt.shape[0] + xv.shape[0] == n
    assert torch.equal(xv, digits.x_train[n - xv.shape[0] :])
    with_val = Dataset(
        "v", digits.x_train, digits.y_train, digits.x_test, digits.y_test, 10, x_val=xv, y_val=yv
    )
    assert validation_split(with_val, 0.25)[1][0] is xv


def test_learned_from_identity_lowers_the_midpoint_loss(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    spec = model.symmetry_spec()
    config = LearnedMatchingConfig(
        steps=150, eval_every=15, patience=10, lr=0.05, weight_matching_init=False
    )
    result = learned_matching(spec, a, b, config, model=model, data=data, seed=0)
    for s in spec:  # hard permutations
        assert torch.equal(torch.sort(result.transform[s.name]).values, torch.arange(s.n))
    naive = _mid_loss(model, a, b, data)
    learned = _mid_loss(model, a, apply(spec, b, result.transform), data)
    assert learned < 0.7 * naive


def test_learned_recovers_a_permuted_copy(mlp_pair) -> None:
    model, a, _, data = mlp_pair
    spec = model.symmetry_spec()
    t = random_transform(spec, 5)
    moved = apply(spec, a, t)
    result = learned_matching(spec, a, moved, FAST, model=model, data=data, seed=0)
    back = apply(spec, moved, result.transform)
    for k in a:
        torch.testing.assert_close(back[k], a[k])


def _val_mid_loss(model, a: Params, b: Params, transform, data: Dataset, loss) -> float:
    """The midpoint loss on the held-out validation slice, computed independently."""
    spec = model.symmetry_spec()
    _, (x, y) = validation_split(data, LearnedMatchingConfig().val_fraction)
    mid = {k: 0.5 * (a[k] + v) for k, v in apply(spec, b, transform).items()}
    model.eval()
    with torch.no_grad():
        return float(loss(functional_call(model, mid, (x,)), y))


def test_learned_returns_the_best_transform_it_validated(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    result = learned_matching(model.symmetry_spec(), a, b, FAST, model=model, data=data, seed=1)
    assert len(result.history) >= 2
    returned = _val_mid_loss(model, a, b, result.transform, data, F.cross_entropy)
    # what it returns is what it validated best, never worse than where it started
    assert returned == pytest.approx(min(result.history), rel=1e-5)
    assert returned <= result.history[0] + 1e-7


def test_the_loss_argument_trains_and_validates(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    spec = model.symmetry_spec()
    config = LearnedMatchingConfig(steps=20, eval_every=10, weight_matching_init=False, lr=0.05)
    default = learned_matching(spec, a, b, config, model=model, data=data, seed=0)

    def doubled(out: Tensor, y: Tensor) -> Tensor:
        return 2 * F.cross_entropy(out, y)

    # Adam is invariant to the loss scale: the same steps, twice the validation losses
    scaled = learned_matching(spec, a, b, config, model=model, data=data, seed=0, loss=doubled)
    assert scaled.history == pytest.approx([2 * h for h in default.history], rel=1e-5)

    def one_hot_mse(out: Tensor, y: Tensor) -> Tensor:
        return F.mse_loss(out, F.one_hot(y, out.shape[-1]).float())

    mse = learned_matching(spec, a, b, config, model=model, data=data, seed=0, loss=one_hot_mse)
    start = _val_mid_loss(model, a, b, Transform.identity(spec), data, one_hot_mse)
    assert mse.history[0] == pytest.approx(start, rel=1e-5)


def test_model_and_data_are_required(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    spec = model.symmetry_spec()
    with pytest.raises(ValueError, match="needs model=... and data=..."):
        learned_matching(spec, a, b, FAST, data=data)
    with pytest.raises(ValueError, match="needs model=... and data=..."):
        learned_matching(spec, a, b, FAST, model=model)


def test_sinkhorn_mode_gives_hard_permutations(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    spec = model.symmetry_spec()
    config = LearnedMatchingConfig(steps=30, eval_every=10, permutations="sinkhorn")
    result = learned_matching(spec, a, b, config, model=model, data=data, seed=0)
    for s in spec:
        assert torch.equal(torch.sort(result.transform[s.name]).values, torch.arange(s.n))


def test_batchnorm_network_is_learned_with_batch_statistics(bn_mlp_pair) -> None:
    model, a, b, data = bn_mlp_pair
    spec = model.symmetry_spec()
    a_before = {k: v.clone() for k, v in a.items()}
    config = LearnedMatchingConfig(steps=40, eval_every=10, weight_matching_init=False, lr=0.05)
    result = learned_matching(spec, a, b, config, model=model, data=data, seed=0)
    assert min(result.history) < result.history[0]
    for k in a:  # inputs, running statistics included, are untouched
        assert torch.equal(a[k], a_before[k])


def test_orthogonal_residual_is_learned_as_an_orthogonal_map(digits: Dataset) -> None:
    module = TinyResidual()
    a, b = _params(module, 0), _params(module, 1)
    spec = module.spec(Orthogonal())
    config = LearnedMatchingConfig(steps=40, eval_every=10, weight_matching_init=False)
    result = learned_matching(spec, a, b, config, model=module, data=digits, seed=0)
    o = result.transform["residual"]
    torch.testing.assert_close(o.T @ o, torch.eye(12), atol=1e-5, rtol=0)
    x = digits.x_test[:20]
    moved = apply(spec, b, result.transform)
    torch.testing.assert_close(
        functional_call(module, moved, (x,)), functional_call(module, b, (x,)), atol=1e-4, rtol=0
    )


def test_unsupported_group_and_bad_config_are_value_errors(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    spec = model.symmetry_spec().with_groups(**{"hidden.0": SemiPermutation()})
    with pytest.raises(ValueError, match="SemiPermutation"):
        learned_matching(spec, a, b, FAST, model=model, data=data, spaces=["hidden.0"])
    # by default such a space is left to weight matching: the others are learned
    result = learned_matching(spec, a, b, FAST, model=model, data=data)
    wm = weight_matching(spec, a, b)
    assert torch.equal(result.transform["hidden.0"].assign, wm.transform["hidden.0"].assign)
    assert "hidden.0" not in result.spaces
    for bad in ({"lam_low": 0.7, "lam_high": 0.6}, {"permutations": "soft"}, {"lr": 0.0}):
        with pytest.raises(ValueError):
            LearnedMatchingConfig(**bad)


def test_spaces_left_out_stay_at_weight_matching(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    spec = model.symmetry_spec()
    wm = weight_matching(spec, a, b, spaces=["hidden.0"], seed=0)
    config = LearnedMatchingConfig(steps=20, eval_every=10, weight_matching_init=False)
    result = learned_matching(
        spec, a, b, config, model=model, data=data, init=wm.transform, spaces=["hidden.1"], seed=0
    )
    assert torch.equal(result.transform["hidden.0"], wm.transform["hidden.0"])
    Permutation().validate(result.transform["hidden.1"], 64)


@pytest.mark.parametrize("circuits", [False, True], ids=["heads", "circuits"])
def test_tiny_gpt2_rms_form_learns_an_orthogonal_residual_map(circuits: bool) -> None:
    from lmckit.forms._rewrites import heads_to_circuits, layernorm_to_rmsnorm

    kwargs = {"vocab_size": 40, "n_layer": 1, "n_head": 2, "n_embd": 16, "context": 8}
    module, params = layernorm_to_rmsnorm(*create_model("gpt2", seed=0, **kwargs))
    if circuits:
        module, params = heads_to_circuits(module, params)
    spec = module.symmetry_spec()
    assert isinstance(spec["residual"].group, Orthogonal)
    moved = apply(spec, params, random_transform(spec, 1))
    x = torch.randint(0, 40, (32, 8), generator=torch.Generator().manual_seed(0))
    data = Dataset("toy", x, torch.roll(x, -1, 1), x[:8], torch.roll(x[:8], -1, 1), 40)
    start = learned_matching(
        spec, params, moved, LearnedMatchingConfig(steps=0), model=module, data=data
    )
    back = apply(spec, moved, start.transform)
    for k in params:  # weight matching's start recovers the copy
        torch.testing.assert_close(back[k], params[k], atol=1e-4, rtol=0)
    config = LearnedMatchingConfig(steps=10, eval_every=5, batch_size=8)
    result = learned_matching(spec, params, moved, config, model=module, data=data, seed=0)
    o = result.transform["residual"]
    # learning may leave the copy (on this random model the midpoint of two different
    # models can validate better than the model itself) but stays in the group
    torch.testing.assert_close(o.T @ o, torch.eye(16), atol=1e-5, rtol=0)


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@_CUDA
def test_learned_on_cuda_matches_the_cpu_run(bn_mlp_pair) -> None:
    model, a, b, data = bn_mlp_pair
    spec = model.symmetry_spec()
    config = LearnedMatchingConfig(steps=20, eval_every=10, weight_matching_init=False, lr=0.05)
    on_cpu = learned_matching(spec, a, b, config, model=model, data=data, seed=0)
    on_gpu = learned_matching(spec, a, b, config, model=model, data=data, seed=0, device="cuda")
    assert next(model.parameters()).device.type == "cpu"  # the caller's model is not moved
    for s in spec:  # the transform comes back on the CPU, a hard permutation
        element = on_gpu.transform[s.name]
        assert element.device.type == "cpu"
        assert torch.equal(torch.sort(element).values, torch.arange(s.n))
    # same batches and lambdas: the two runs see the same objective (float noise aside)
    assert on_gpu.history[0] == pytest.approx(on_cpu.history[0], rel=1e-4)
    assert min(on_gpu.history) <= on_gpu.history[0]


@_CUDA
def test_tiny_gpt2_orthogonal_map_is_learned_on_cuda() -> None:
    from lmckit.forms._rewrites import layernorm_to_rmsnorm

    kwargs = {"vocab_size": 40, "n_layer": 1, "n_head": 2, "n_embd": 16, "context": 8}
    module, params = layernorm_to_rmsnorm(*create_model("gpt2", seed=0, **kwargs))
    spec = module.symmetry_spec()
    moved = apply(spec, params, random_transform(spec, 1))
    x = torch.randint(0, 40, (32, 8), generator=torch.Generator().manual_seed(0))
    data = Dataset("toy", x, torch.roll(x, -1, 1), x[:8], torch.roll(x[:8], -1, 1), 40)
    config = LearnedMatchingConfig(steps=10, eval_every=5, batch_size=8)
    result = learned_matching(
        spec, params, moved, config, model=module, data=data, seed=0, device="cuda"
    )
    back = apply(spec, moved, result.transform)
    for k in params:
        torch.testing.assert_close(back[k], params[k], atol=1e-2, rtol=0)


def test_learned_with_an_explicit_cpu_device_is_the_default_run(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    spec = model.symmetry_spec()
    config = LearnedMatchingConfig(steps=10, eval_every=5)
    default = learned_matching(spec, a, b, config, model=model, data=data, seed=0)
    explicit = learned_matching(spec, a, b, config, model=model, data=data, seed=0, device="cpu")
    assert default.history == explicit.history
    for s in spec:
        assert torch.equal(default.transform[s.name], explicit.transform[s.name])


def test_time_limit_stops_early_and_still_validates(mlp_pair) -> None:
    model, a, b, data = mlp_pair
    spec = model.symmetry_spec()
    config = LearnedMatchingConfig(steps=10_000, eval_every=10_000, max_seconds=1e-9)
    result = learned_matching(spec, a, b, config, model=model, data=data, seed=0)
    assert result.iterations == 1  # one step, then out of time
    assert len(result.history) == 2  # the start and the transform at the stop
    with pytest.raises(ValueError, match="max_seconds"):
        LearnedMatchingConfig(max_seconds=0)


def test_row_masks_reach_the_weight_matching_start() -> None:
    from lmckit.forms._rewrites import layernorm_to_rmsnorm

    kwargs = {"vocab_size": 17, "n_layer": 1, "n_head": 2, "n_embd": 8, "context": 4}
    module, a = layernorm_to_rmsnorm(*create_model("gpt2", seed=0, **kwargs))
    _, b = layernorm_to_rmsnorm(*create_model("gpt2", seed=1, **kwargs))
    spec = module.symmetry_spec()
    seen = torch.arange(17) < 9
    masks = {"transformer.wte.weight": seen, "lm_head.weight": seen}
    noisy = dict(b)
    gen = torch.Generator().manual_seed(0)
    for key in masks:
        noisy[key] = b[key].clone()
        noisy[key][~seen] = 100 * torch.randn(8, 8, generator=gen)
    x = torch.randint(0, 9, (16, 4), generator=gen)  # only seen tokens in the data
    data = Dataset("toy", x, torch.roll(x, -1, 1), x[:4], torch.roll(x[:4], -1, 1), 17)
    config = LearnedMatchingConfig(steps=0)  # the start only
    start = weight_matching(spec, a, b, row_masks=masks).transform
    learned = learned_matching(spec, a, noisy, config, model=module, data=data, row_masks=masks)
    torch.testing.assert_close(learned.transform["residual"], start["residual"], atol=1e-4, rtol=0)


def _planted(module: nn.Module, spec: SymmetrySpec, space: str, seed: int) -> tuple[Params, Params]:
    """A model and its copy moved by a random element of one space (same function)."""
    a = _params(module, 0)
    group = spec[space].group
    element = group.random(spec[space].n, torch.Generator().manual_seed(seed))
    return a, apply(spec, a, Transform(spec, {space: element}))


def test_invertible_residual_is_learned_back_from_a_planted_map(digits: Dataset) -> None:
    module = TinyResidual()
    spec = module.spec(Invertible())
    a, b = _planted(module, spec, "residual", 3)
    config = LearnedMatchingConfig(steps=150, eval_every=10, lr=0.02, weight_matching_init=False)
    result = learned_matching(spec, a, b, config, model=module, data=digits, seed=0)
    moved = apply(spec, b, result.transform)
    x = digits.x_test[:20]  # a map of the group: B's function is kept
    torch.testing.assert_close(
        functional_call(module, moved, (x,)), functional_call(module, b, (x,)), atol=1e-3, rtol=0
    )
    before, after = _mid_loss(module, a, b, digits), _mid_loss(module, a, moved, digits)
    assert after < before - 0.5 * (before - _mid_loss(module, a, a, digits))


def test_scales_of_a_gated_branch_are_learned_through_their_readers(digits: Dataset) -> None:
    module = TinyGated()
    spec = module.spec()
    a, b = _planted(module, spec, "hidden.scale", 4)
    target = torch.log(a["up.weight"].norm(dim=1))
    config = LearnedMatchingConfig(steps=150, eval_every=10, lr=0.02, weight_matching_init=False)
    result = learned_matching(
        spec, a, b, config, model=module, data=digits, seed=0, spaces=["hidden.scale"]
    )
    scales = result.transform["hidden.scale"]
    assert bool((scales > 0).all())
    moved = apply(spec, b, result.transform)
    x = digits.x_test[:20]
    torch.testing.assert_close(
        functional_call(module, moved, (x,)), functional_call(module, b, (x,)), atol=1e-4, rtol=0
    )
    # the learned scales undo the planted ones: most of B's up rows move back to A's
    # norms (the model is random: for a few units another scale gives a lower loss)
    log_norms = torch.log(moved["up.weight"].norm(dim=1))
    start = torch.log(b["up.weight"].norm(dim=1))
    assert float((start - target).abs().median()) > 0.3
    assert float((log_norms - target).abs().median()) < 0.01
    assert _mid_loss(module, a, moved, digits) < _mid_loss(module, a, b, digits)
