"""Activation matching: planted permutations recovered, streamed statistics exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from lmckit.aligners import ActivationMatchingConfig, activation_matching
from lmckit.aligners._cross_statistics import CrossStatistics, collect_cross_statistics
from lmckit.data import Dataset
from lmckit.models import create_model
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import (
    Invertible,
    Orthogonal,
    Permutation,
    Probe,
    Space,
    SymmetrySpec,
    Use,
    apply,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batches(shape: tuple[int, ...], count: int, size: int, seed: int) -> list[Tensor]:
    gen = _gen(seed)
    return [torch.randn(size, *shape, generator=gen) for _ in range(count)]


def _assert_params_equal(a: Params, b: Params) -> None:
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


@pytest.mark.parametrize("statistic", ["correlation", "covariance"])
def test_recovers_a_permuted_mlp(statistic: str) -> None:
    module, params = create_model(
        "mlp", seed=0, in_features=10, hidden=[24, 24], out_features=3, norm="layer"
    )
    spec = module.symmetry_spec()
    permuted = apply(spec, params, random_transform(spec, 1))
    config = ActivationMatchingConfig(statistic)  # type: ignore[arg-type]
    inputs = _batches((10,), 4, 64, seed=2)
    result = activation_matching(spec, params, permuted, config, model=module, data=inputs)
    _assert_params_equal(params, apply(spec, permuted, result.transform))
    for diag in result.spaces.values():
        assert diag.objective_after > diag.objective_before


def test_recovers_a_permuted_resnet20() -> None:
    module, params = create_model("resnet20", seed=0, in_channels=1, num_classes=3, width_mult=1)
    spec = module.symmetry_spec()
    permuted = apply(spec, params, random_transform(spec, 3))
    inputs = _batches((1, 8, 8), 2, 16, 4)
    result = activation_matching(spec, params, permuted, model=module, data=inputs)
    assert set(result.spaces) == set(spec.names)
    _assert_params_equal(params, apply(spec, permuted, result.transform))


def test_space_without_probes_is_a_clear_error() -> None:
    net = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    params = {k: v.detach().clone() for k, v in net.state_dict().items()}
    uses = (Use("0.weight", 0, "write"), Use("1.weight", 1, "read"))
    spec = SymmetrySpec((Space("h", 3, Permutation(), uses),))
    with pytest.raises(ValueError, match="space 'h' has no probes"):
        activation_matching(spec, params, params, model=net, data=[torch.randn(4, 4)])
    missing = SymmetrySpec((Space("h", 3, Permutation(), uses, (Probe("nowhere"),)),))
    with pytest.raises(ValueError, match="nowhere"):
        activation_matching(missing, params, params, model=net, data=[torch.randn(4, 4)])


def test_bad_arguments_are_refused() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[5], out_features=2)
    spec = module.symmetry_spec()
    with pytest.raises(ValueError, match="statistic must be"):
        ActivationMatchingConfig(statistic="cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no input batches"):
        activation_matching(spec, params, params, model=module, data=[])
    with pytest.raises(ValueError, match="not one tensor"):
        activation_matching(spec, params, params, model=module, data=torch.randn(3, 4))
    with pytest.raises(ValueError, match="needs model=... and data=..."):
        activation_matching(spec, params, params, data=[torch.randn(3, 4)])


def test_streamed_statistics_equal_numpy_full_batch() -> None:
    gen = _gen(7)
    # correlated features with a nonzero mean, so centring matters
    a = torch.randn(300, 5, generator=gen, dtype=torch.float64) * 2 + 3
    b = a[:, [2, 0, 1]] + 0.5 * torch.randn(300, 3, generator=gen, dtype=torch.float64) - 1
    stats = CrossStatistics.zeros(5, 3)
    for chunk in range(0, 300, 70):  # uneven chunks, the last one short
        stats.update(a[chunk : chunk + 70].float(), b[chunk : chunk + 70].float())
    assert stats.count == 300
    a_np, b_np = a.float().double().numpy(), b.float().double().numpy()
    corr = np.corrcoef(a_np.T, b_np.T)[:5, 5:]
    cov = np.cov(a_np.T, b_np.T, bias=True)[:5, 5:]
    np.testing.assert_allclose(stats.correlation().numpy(), corr, atol=1e-6)
    np.testing.assert_allclose(stats.covariance().numpy(), cov, atol=1e-6)
    with pytest.raises(ValueError, match="no samples"):
        CrossStatistics.zeros(2, 2).covariance()


def test_collected_statistics_do_not_depend_on_batching() -> None:
    module, a = create_model("mlp", seed=0, in_features=6, hidden=[7, 7], out_features=2)
    _, b = create_model("mlp", seed=1, in_features=6, hidden=[7, 7], out_features=2)
    spec = module.symmetry_spec()
    x = torch.randn(90, 6, generator=_gen(8))
    streamed = collect_cross_statistics(module, spec, a, b, list(x.split(25)))
    whole = collect_cross_statistics(module, spec, a, b, [x])
    for name in spec.names:
        torch.testing.assert_close(streamed[name].correlation(), whole[name].correlation())
    # and against the activations computed directly (first hidden layer after ReLU)
    h_a = torch.relu(x @ a["layers.0.weight"].T + a["layers.0.bias"]).double().numpy()
    h_b = torch.relu(x @ b["layers.0.weight"].T + b["layers.0.bias"]).double().numpy()
    direct = np.cov(h_a.T, h_b.T, bias=True)[:7, 7:]
    np.testing.assert_allclose(whole["hidden.0"].covariance().numpy(), direct, atol=1e-5)


def _dataset(x: Tensor) -> Dataset:
    y = torch.zeros(len(x), dtype=torch.long)
    return Dataset("toy", x, y, x[:4], y[:4], 3)


def test_common_signature_streams_the_first_training_batches() -> None:
    module, params = create_model(
        "mlp", seed=0, in_features=10, hidden=[24, 24], out_features=3, norm="layer"
    )
    spec = module.symmetry_spec()
    permuted = apply(spec, params, random_transform(spec, 1))
    x = torch.randn(256, 10, generator=_gen(2))
    config = ActivationMatchingConfig(batch_size=64, batches=2)
    result = activation_matching(spec, params, permuted, config, model=module, data=_dataset(x))
    _assert_params_equal(params, result.apply(permuted))
    # exactly the first two batches of 64: the same statistics as those inputs given directly
    direct = activation_matching(spec, params, permuted, model=module, data=x[:128].split(64))
    for name, diag in result.spaces.items():
        assert diag.objective_before == pytest.approx(direct.spaces[name].objective_before)
    with pytest.raises(ValueError, match="needs model=... and data=..."):
        activation_matching(spec, params, permuted, config, data=_dataset(x))


def test_orthogonal_spaces_are_solved_by_covariance_procrustes() -> None:
    # the cross-covariance of h and O h is Sigma O^T, whose polar factor is O^T; Pearson
    # correlation is not orthogonally equivariant and misses O. "natural" picks the
    # covariance for the Orthogonal space.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 5), nn.Identity(), nn.Linear(5, 2))
    params = {k: v.detach().clone() for k, v in net.state_dict().items()}
    uses = (Use("0.weight", 0, "write"), Use("0.bias", 0, "write"), Use("2.weight", 1, "read"))
    spec = SymmetrySpec((Space("h", 5, Orthogonal(), uses, (Probe("1"),)),))
    moved = apply(spec, params, random_transform(spec, 5))
    data = _dataset(torch.randn(150, 6, generator=_gen(6)))
    for stat in ("natural", "covariance", "correlation"):
        config = ActivationMatchingConfig(stat, batch_size=50, batches=3)  # type: ignore[arg-type]
        aligned = activation_matching(spec, params, moved, config, model=net, data=data).apply(
            moved
        )
        recovered = all(torch.allclose(aligned[k], params[k], atol=1e-4) for k in params)
        assert recovered == (stat != "correlation"), stat


def test_least_squares_spaces_and_bad_configs_are_refused() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[5], out_features=2)
    spec = module.symmetry_spec().with_groups(**{"hidden.0": Invertible()})
    with pytest.raises(ValueError, match="cannot solve space 'hidden.0': Invertible"):
        activation_matching(spec, params, params, model=module, data=[torch.randn(3, 4)])
    for bad in ({"statistic": "cosine"}, {"batch_size": 0}, {"batches": 0}):
        with pytest.raises(ValueError):
            ActivationMatchingConfig(**bad)  # type: ignore[arg-type]


class SharedBlock(nn.Module):
    """One block's weights used by two layers (as ALBERT's one layer runs twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(6, 8), nn.Linear(8, 3)
        self.block = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh())

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.inp(x))
        return self.out(self.block(self.block(h)))


def test_a_block_run_twice_is_seen_at_both_calls_and_its_permutation_recovered() -> None:
    from lmckit.inference import analyze_symmetries

    torch.manual_seed(0)
    module = SharedBlock()
    params = {k: v.detach().clone() for k, v in module.state_dict().items()}
    spec = analyze_symmetries(module, (torch.randn(5, 6),)).spec
    hidden = next(s for s in spec if any(u.param == "block.0.weight" and u.axis == 0
                                         for u in s.uses))  # fmt: skip
    assert hidden.n == 16 and [p.module for p in hidden.probes] == ["block.2"]
    # block.2 runs twice per pass: the samples of both calls are pooled
    inputs = _batches((6,), 3, 32, seed=5)
    stats = collect_cross_statistics(module, spec, params, params, inputs)
    assert stats[hidden.name].count == 2 * 3 * 32
    permuted = apply(spec, params, random_transform(spec, 11))
    assert not torch.equal(permuted["block.0.weight"], params["block.0.weight"])
    result = activation_matching(spec, params, permuted, model=module, data=inputs)
    _assert_params_equal(params, apply(spec, permuted, result.transform))
