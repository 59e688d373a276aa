"""Checkpoint save/load: exact round trips, and refusal of unsafe, broken or wrong files."""

from __future__ import annotations

import json
import os
import pickle
import shlex
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lmckit.formats._checkpoint import (
    CheckpointError,
    CheckpointFormat,
    load,
    load_metadata,
    load_params_file,
    save,
)
from lmckit.models import ModelConfig, create_model
from lmckit.symmetry._params import Params

MLP_KWARGS = {"in_features": 8, "hidden": [16, 16], "out_features": 3, "norm": "batch"}


@pytest.fixture
def mlp() -> tuple[torch.nn.Module, Params]:
    model, params = create_model("mlp", seed=0, **MLP_KWARGS)
    # Non-default BatchNorm statistics, so the round trip checks buffers too.
    gen = torch.Generator().manual_seed(1)
    for i in range(2):
        params[f"norms.{i}.running_mean"] = torch.randn(16, generator=gen)
        params[f"norms.{i}.running_var"] = torch.rand(16, generator=gen) + 0.5
        params[f"norms.{i}.num_batches_tracked"] = torch.tensor(7)
    model.load_state_dict(params)
    model.eval()
    return model, params


def _assert_same(a: Params, b: Params) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def test_roundtrip_identical_tensors_and_outputs(tmp_path: Path, mlp) -> None:
    model, params = mlp
    out = save(tmp_path / "ckpt", model, params, metadata={"epoch": 3, "note": "x"})
    assert out == tmp_path / "ckpt"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    doc = json.loads((out / "config.json").read_text())
    assert doc["architecture"] == "mlp" and doc["kwargs"] == MLP_KWARGS
    assert "lmckit_version" in doc and doc["metadata"] == {"epoch": 3, "note": "x"}

    ckpt = load(out)
    assert isinstance(ckpt.format, CheckpointFormat) and ckpt.format.name == "lmckit"
    assert ckpt.config == ModelConfig("mlp", MLP_KWARGS)
    assert not ckpt.module.training
    _assert_same(ckpt.params, params)
    _assert_same(dict(ckpt.module.state_dict()), params)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(ckpt.module(x), model(x))
    assert load_metadata(out) == {"epoch": 3, "note": "x"}
    # The weights file itself is accepted too.
    _assert_same(load(out / "model.safetensors").params, params)


def test_save_with_config_overwrites_and_leaves_no_temp(tmp_path: Path, mlp) -> None:
    _model, params = mlp
    config = ModelConfig("mlp", MLP_KWARGS)
    save(tmp_path / "ckpt", config, params)
    params2 = {k: v + 1 if v.is_floating_point() else v for k, v in params.items()}
    save(tmp_path / "ckpt", config, params2)
    _assert_same(load(tmp_path / "ckpt").params, params2)
    assert load_metadata(tmp_path / "ckpt") == {}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_save_shared_and_noncontiguous_tensors(tmp_path: Path, mlp) -> None:
    model, params = mlp
    params = dict(params)
    params["norms.0.bias"] = params["norms.0.weight"]  # the same storage twice
    params["layers.1.weight"] = params["layers.1.weight"].t().contiguous().t()
    assert not params["layers.1.weight"].is_contiguous()
    save(tmp_path / "ckpt", model, params)
    _assert_same(load(tmp_path / "ckpt").params, params)


def test_save_refuses_nan_and_writes_nothing(tmp_path: Path, mlp) -> None:
    model, params = mlp
    params = dict(params)
    params["layers.1.bias"] = params["layers.1.bias"].clone()
    params["layers.1.bias"][3] = float("nan")
    with pytest.raises(CheckpointError, match="layers.1.bias"):
        save(tmp_path / "ckpt", model, params)
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_wrong_layout(tmp_path: Path, mlp) -> None:
    model, params = mlp
    params = {k: v for k, v in params.items() if k != "head.bias"}
    with pytest.raises(CheckpointError, match="'head.bias'.*missing"):
        save(tmp_path / "ckpt", model, params)
    assert list(tmp_path.iterdir()) == []


def test_load_pt_state_dict(tmp_path: Path, mlp) -> None:
    model, params = mlp
    save(tmp_path / "ckpt", model, params)
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "ckpt" / "model.pt")
    ckpt = load(tmp_path / "ckpt")
    _assert_same(ckpt.params, params)
    _assert_same(load_params_file(tmp_path / "ckpt" / "model.pt"), params)  # file order kept


class _Evil:
    def __init__(self, sentinel: Path) -> None:
        self.cmd = f"touch {shlex.quote(str(sentinel))}"

    def __reduce__(self):
        return (os.system, (self.cmd,))


@pytest.mark.parametrize("how", ["torch.save", "pickle", "torch.save-legacy"])
def test_malicious_pickle_is_refused_and_not_run(tmp_path: Path, mlp, how: str) -> None:
    model, params = mlp
    save(tmp_path / "ckpt", model, params)
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    sentinel = tmp_path / "SENTINEL"
    weights = tmp_path / "ckpt" / "model.pt"
    payload = {**params, "layers.0.weight": _Evil(sentinel)}
    if how == "pickle":
        with open(weights, "wb") as fh:
            pickle.dump(payload, fh)
    else:
        torch.save(payload, weights, _use_new_zipfile_serialization=how == "torch.save")
    for call in (load, load_params_file):
        target = tmp_path / "ckpt" if call is load else weights
        with pytest.raises(CheckpointError, match="refusing to load .*unsafe pickle"):
            call(target)
    assert not sentinel.exists()


def test_truncated_safetensors(tmp_path: Path, mlp) -> None:
    model, params = mlp
    save(tmp_path / "ckpt", model, params)
    weights = tmp_path / "ckpt" / "model.safetensors"
    data = weights.read_bytes()
    for n in (0, 5, len(data) // 2, len(data) - 1):
        weights.write_bytes(data[:n])
        with pytest.raises(CheckpointError, match="model.safetensors is corrupt or truncated"):
            load(tmp_path / "ckpt")


@pytest.mark.parametrize("zipfile", [True, False])
def test_truncated_pt(tmp_path: Path, mlp, zipfile: bool) -> None:
    model, params = mlp
    weights = tmp_path / "model.pt"
    torch.save(params, weights, _use_new_zipfile_serialization=zipfile)
    data = weights.read_bytes()
    cuts = {0, 1, 3, 60, 200, 500, len(data) // 2, len(data) - 1}
    if not zipfile:
        # A cut inside a pickled class name looks like a disallowed global to the
        # weights-only unpickler; it must still be reported as truncated, not unsafe.
        cuts |= {data.index(b"collections") + 5, data.index(b"_rebuild_tensor") + 3}
    for n in sorted(cuts):
        weights.write_bytes(data[:n])
        with pytest.raises(CheckpointError, match="model.pt is corrupt or truncated"):
            load_params_file(weights)


def test_pt_must_be_flat_tensor_dict(tmp_path: Path, mlp) -> None:
    _model, params = mlp
    weights = tmp_path / "model.pt"
    torch.save({"state_dict": params, "epoch": 3}, weights)
    with pytest.raises(CheckpointError, match="'state_dict' entry"):
        load_params_file(weights)
    torch.save([params["head.bias"]], weights)
    with pytest.raises(CheckpointError, match="not hold a state dict"):
        load_params_file(weights)


def test_missing_config(tmp_path: Path, mlp) -> None:
    model, params = mlp
    save(tmp_path / "ckpt", model, params)
    (tmp_path / "ckpt" / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load(tmp_path / "ckpt")


def test_invalid_config_json(tmp_path: Path, mlp) -> None:
    model, params = mlp
    save(tmp_path / "ckpt", model, params)
    (tmp_path / "ckpt" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        load(tmp_path / "ckpt")


def test_unknown_architecture(tmp_path: Path, mlp) -> None:
    model, params = mlp
    save(tmp_path / "ckpt", model, params)
    cfg = tmp_path / "ckpt" / "config.json"
    cfg.write_text(json.dumps({"architecture": "no-such-net", "kwargs": {}}))
    with pytest.raises(CheckpointError, match=r"config.json: unknown model 'no-such-net'"):
        load(tmp_path / "ckpt")


def test_missing_weights_and_path(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no weights file"):
        load(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="does not exist"):
        load(tmp_path / "nowhere")


def _write_raw(d: Path, params: Params) -> None:
    d.mkdir()
    save_file({k: v.contiguous() for k, v in params.items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"architecture": "mlp", "kwargs": MLP_KWARGS}))


def test_key_mismatch_names_the_key(tmp_path: Path, mlp) -> None:
    _model, params = mlp
    missing = {k: v for k, v in params.items() if k != "layers.1.bias"}
    _write_raw(tmp_path / "a", missing)
    with pytest.raises(CheckpointError, match="'layers.1.bias' of 'mlp' is missing"):
        load(tmp_path / "a")

    extra = {**params, "layers.9.weight": torch.zeros(2)}
    _write_raw(tmp_path / "b", extra)
    with pytest.raises(CheckpointError, match="unexpected parameter 'layers.9.weight'"):
        load(tmp_path / "b")

    wrong = {**params, "head.weight": torch.zeros(4, 16)}
    _write_raw(tmp_path / "c", wrong)
    with pytest.raises(CheckpointError, match=r"'head.weight' has shape \(4, 16\).*\(3, 16\)"):
        load(tmp_path / "c")


def test_nan_refused_on_load(tmp_path: Path, mlp) -> None:
    _model, params = mlp
    bad = dict(params)
    bad["norms.1.running_var"] = bad["norms.1.running_var"].clone()
    bad["norms.1.running_var"][0] = float("inf")
    _write_raw(tmp_path / "ckpt", bad)
    with pytest.raises(CheckpointError, match="model.safetensors.*'norms.1.running_var'"):
        load(tmp_path / "ckpt")
    assert "norms.1.running_var" in load_params_file(
        tmp_path / "ckpt" / "model.safetensors", require_finite=False
    )


def test_load_keeps_global_rng(tmp_path: Path, mlp) -> None:
    model, params = mlp
    save(tmp_path / "ckpt", model, params)
    before = torch.random.get_rng_state()
    load(tmp_path / "ckpt")
    assert torch.equal(torch.random.get_rng_state(), before)
