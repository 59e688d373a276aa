"""The experiment runner: config hash, model and stage cache, device, tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

import lmckit
from lmckit.data import Dataset
from lmckit.data._regression import RegressionData
from lmckit.experiments import ExperimentContext
from lmckit.experiments._runner import Runner, choose_device, config_hash
from lmckit.models import create_model
from lmckit.training._task import mse
from lmckit.training._train import TrainConfig, fit

FAST = TrainConfig(epochs=1, batch_size=64, lr=3e-3)


@dataclass(frozen=True)
class _Config:
    width: int
    train: TrainConfig


def _ctx(out: Path, seed: int = 0, log: list[str] | None = None) -> ExperimentContext:
    sink = log.append if log is not None else (lambda _msg: None)
    return ExperimentContext(out, out, quick=True, seed=seed, progress=False, log=sink)


def _mlp(seed: int):
    return create_model("mlp", seed=seed, in_features=64, hidden=[16], out_features=10)


def test_config_hash_is_stable_and_sees_every_field() -> None:
    base = _Config(16, FAST)
    assert config_hash(base) == config_hash(
        _Config(16, TrainConfig(epochs=1, batch_size=64, lr=3e-3))
    )
    assert config_hash(base) != config_hash(_Config(17, FAST))
    assert config_hash(base) != config_hash(
        _Config(16, TrainConfig(epochs=2, batch_size=64, lr=3e-3))
    )
    # a dataclass hashes as the dict of its fields, tuples as lists
    assert config_hash({"a": (1, 2)}) == config_hash({"a": [1, 2]})
    assert len(config_hash(base)) == 10


def test_models_are_trained_once_then_reloaded_as_checkpoints(
    tmp_path: Path, digits: Dataset
) -> None:
    log: list[str] = []
    run = Runner(_ctx(tmp_path, log=log), _Config(16, FAST))
    module, a, b = run.train_pair("mlp", _mlp, digits, FAST)
    # what the library's training gives for the same seed
    _, init = _mlp(1)
    assert all(
        torch.equal(b[k], v)
        for k, v in fit(module, init, digits, FAST, seed=1, progress=False).params.items()
    )
    assert run.root == tmp_path / f"quick-{config_hash(_Config(16, FAST))}"
    assert lmckit.load(run.root / "models" / "mlp-seed0").config.name == "mlp"
    again = Runner(_ctx(tmp_path, log=log), _Config(16, FAST))
    _, a2, b2 = again.train_pair("mlp", _mlp, digits, FAST)
    assert all(torch.equal(a[k], a2[k]) and torch.equal(b[k], b2[k]) for k in a)
    assert "train mlp-seed0" in run.seconds and not again.seconds
    # another training setup under the same name is trained again, not reloaded
    other = TrainConfig(epochs=1, batch_size=32, lr=3e-3)
    _, a3 = again.train("mlp-seed0", lambda: _mlp(0), digits, other, seed=0)
    assert not torch.equal(a3["head.weight"], a["head.weight"])
    assert any("trained with another setup" in line for line in log)


class _Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).squeeze(-1)


def test_any_module_and_task_are_cached(tmp_path: Path) -> None:
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    data = RegressionData("r", x, x.sum(1), x[:8], x[:8].sum(1))

    def build():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            module = _Regressor()
        return module, {k: v.detach().clone() for k, v in module.state_dict().items()}

    config = TrainConfig(epochs=30, batch_size=16, optimizer="adam", lr=0.05)
    first = Runner(_ctx(tmp_path), {"k": 1}).train("reg", build, data, config, seed=0, task=mse())[
        1
    ]
    again = Runner(_ctx(tmp_path), {"k": 1})
    second = again.train("reg", build, data, config, seed=0, task=mse())[1]
    assert not again.seconds and torch.equal(first["linear.weight"], second["linear.weight"])
    torch.testing.assert_close(first["linear.weight"], torch.ones(1, 3), atol=0.05, rtol=0)


def test_stages_are_cached_per_seed(tmp_path: Path) -> None:
    calls: list[int] = []

    def compute(value: int) -> dict:
        calls.append(value)
        return {"value": value}

    run = Runner(_ctx(tmp_path), {"k": 1})
    assert run.stage("s", lambda: compute(1))["value"] == 1
    assert run.stage("s", lambda: compute(2))["value"] == 1  # cached: not computed again
    assert calls == [1]
    seed1 = Runner(_ctx(tmp_path, seed=1), {"k": 1})
    assert seed1.stage("s", lambda: compute(3))["value"] == 3
    assert calls == [1, 3]


def test_device_choice() -> None:
    assert choose_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="one of auto, cpu, cuda"):
        choose_device("tpu")
    if not torch.cuda.is_available():
        assert choose_device("auto") == torch.device("cpu")
        with pytest.raises(ValueError, match="CUDA is not available"):
            choose_device("cuda")
