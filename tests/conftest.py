"""Shared tiny fixtures: digits, and pairs of small MLPs trained on it for a few seconds.

Built once per test session; tests must not modify them (the library never mutates its
inputs, and several tests check exactly that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.data import Dataset, load_digits
from lmckit.models import ZooModel, create_model
from lmckit.symmetry._params import Params
from lmckit.training._train import TrainConfig, fit

#: Hidden widths of the fixture MLPs (64 -> 64 -> 64 -> 10).
PAIR_HIDDEN = [64, 64]
PAIR_TRAIN = TrainConfig(epochs=6, batch_size=64, lr=3e-3)


def pytest_configure(config: pytest.Config) -> None:
    # The test models are tiny: a second intra-op thread buys nothing, and on a busy
    # 2-core machine OpenMP's spinning threads made them 10x slower in wall time.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seeded_global_rng() -> None:
    """Every test starts from one state of PyTorch's global generator: what a test draws
    without a generator of its own is the same whichever tests ran before it."""
    torch.manual_seed(0)


class TrainedPair(NamedTuple):
    """Two independently trained models of one architecture (seeds 0 and 1)."""

    model: ZooModel
    a: Params
    b: Params
    data: Dataset


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_digits(seed=0)


def _pair(data: Dataset, norm: str) -> TrainedPair:
    trained = []
    for seed in (0, 1):
        model, init = create_model(
            "mlp", seed=seed, in_features=64, hidden=PAIR_HIDDEN, out_features=10, norm=norm
        )
        trained.append(fit(model, init, data, PAIR_TRAIN, seed=seed, progress=False).params)
    return TrainedPair(model, trained[0], trained[1], data)


@pytest.fixture(scope="session")
def mlp_pair(digits: Dataset) -> TrainedPair:
    """ReLU MLPs without normalisation."""
    return _pair(digits, "none")


@pytest.fixture(scope="session")
def bn_mlp_pair(digits: Dataset) -> TrainedPair:
    """ReLU MLPs with BatchNorm after each hidden Linear."""
    return _pair(digits, "batch")


Outputs = Callable[[nn.Module, Mapping[str, Tensor], Tensor], Tensor]


def model_outputs(module: nn.Module, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
    """``module``'s outputs on ``x`` with ``params`` (eval mode, no gradients)."""
    module.eval()
    with torch.no_grad():
        return functional_call(module, dict(params), (x,))


@pytest.fixture(scope="session")
def hf_folder_pair(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """``hf_folder_pair(family)``: two tiny folders of that family (seeds 0 and 1), built
    once per session (read only: copy them before changing anything)."""
    built: dict[str, tuple[Path, Path]] = {}

    def get(family: str) -> tuple[Path, Path]:
        if family not in built:
            import transformers
            from tests.tiny_models import build_hf_folder

            transformers.utils.logging.disable_progress_bar()
            root = tmp_path_factory.mktemp(f"hf-pair-{family}")
            built[family] = (
                build_hf_folder(family, root / "a", seed=0),
                build_hf_folder(family, root / "b", seed=1),
            )
        return built[family]

    return get


@pytest.fixture(scope="session")
def outputs() -> Outputs:
    """The shared ``outputs(module, params, x)`` helper (:func:`model_outputs`)."""
    return model_outputs
