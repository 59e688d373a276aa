"""One loader, one type: ``lmckit.load`` reads every format into a ``LoadedModel``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import lmckit
from lmckit._errors import ParameterError
from lmckit.formats._io import held_model
from lmckit.models import create_model
from lmckit.symmetry._params import IncompatibleModelsError


def _module(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).eval()


def test_a_parameters_file_is_read_with_the_module_it_belongs_to(tmp_path: Path) -> None:
    a, b = _module(0), _module(1)
    file = lmckit.save_model(tmp_path / "b.safetensors", held_model(a), dict(b.state_dict()))
    loaded = lmckit.load(file, like=a)
    assert isinstance(loaded, lmckit.LoadedModel) and loaded.format.name == "module"
    assert loaded.module is not a and loaded.path == file
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(loaded.module(x), b(x), rtol=0, atol=0)
    assert all(
        torch.equal(p, q) for p, q in zip(a.parameters(), _module(0).parameters(), strict=True)
    )
    with pytest.raises(ParameterError, match="give the module these parameters belong to, like"):
        lmckit.load(file)
    other = nn.Sequential(nn.Linear(4, 7), nn.ReLU(), nn.Linear(7, 3))
    with pytest.raises(IncompatibleModelsError, match="does not hold"):
        lmckit.load(file, like=other)


def test_every_format_is_one_type_that_writes_itself(tmp_path: Path) -> None:
    zoo, params = create_model("mlp", seed=0, in_features=4, hidden=[5], out_features=3)
    folder = lmckit.save(tmp_path / "ckpt", zoo, params)
    ckpt = lmckit.load(folder)
    assert ckpt.format.name == "lmckit" and ckpt.config == zoo.config
    # the format writes a result like it, and compares configurations
    moved = {k: v + 1 for k, v in ckpt.params.items()}
    again = lmckit.load(ckpt.format.save(tmp_path / "moved", ckpt, moved, metadata=None,
                                         overwrite=False))  # fmt: skip
    assert all(torch.equal(again.params[k], moved[k]) for k in moved)
    wider, _ = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    other = lmckit.load(lmckit.save(tmp_path / "wider", wider, wider.state_dict()))
    with pytest.raises(IncompatibleModelsError, match="different architectures"):
        lmckit.load(folder, like=other)
    # a zoo model's parameters alone are read as that zoo model, written as a checkpoint
    bare = tmp_path / "bare"
    bare.mkdir()
    save_file({k: v.contiguous() for k, v in moved.items()}, str(bare / "w.safetensors"))
    as_zoo = lmckit.load(bare / "w.safetensors", like=zoo)
    assert as_zoo.format.name == "lmckit" and as_zoo.config == zoo.config
    assert all(torch.equal(as_zoo.params[k], moved[k]) for k in moved)
