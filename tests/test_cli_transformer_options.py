"""CLI: `align --method learned --symmetry ...` and `barrier A B C ... --simplex`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from lmckit.cli import main
from lmckit.data import Dataset
from lmckit.formats._checkpoint import load, save
from lmckit.models import create_model
from lmckit.symmetry._transform import Orthogonal
from lmckit.training._train import TrainConfig, fit


@pytest.fixture(scope="module")
def checkpoints(mlp_pair, digits: Dataset, tmp_path_factory) -> list[str]:
    """Three MLPs (64 -> 64 -> 64 -> 10) trained on digits, saved as checkpoints."""
    model, a, b, _ = mlp_pair
    _, init = create_model("mlp", seed=2, in_features=64, hidden=[64, 64], out_features=10)
    c = fit(
        model, init, digits, TrainConfig(epochs=6, batch_size=64, lr=3e-3), seed=2, progress=False
    ).params
    root = tmp_path_factory.mktemp("ckpt")
    paths = []
    for name, params in zip("abc", (a, b, c), strict=True):
        save(root / name, model, params)
        paths.append(str(root / name))
    return paths


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _path(a: str, b: str, tmp: Path, name: str, *flags: str) -> dict:
    _invoke("barrier", a, b, "--data", "digits", "--json", str(tmp / name), "--quiet", *flags)
    return json.loads((tmp / name).read_text())


def _barrier(a: str, b: str, tmp: Path, name: str) -> float:
    return _path(a, b, tmp, name)["barrier_loss"]


def _saved(tmp_path: Path, name: str, count: int, **kwargs: object) -> list[str]:
    """``count`` seeds of a zoo model saved as checkpoints; their paths."""
    paths = []
    for seed in range(count):
        module, params = create_model(name, seed=seed, **kwargs)
        save(tmp_path / f"{name}{seed}", module, params)
        paths.append(str(tmp_path / f"{name}{seed}"))
    return paths


def _gpt2s(tmp_path: Path, count: int) -> list[str]:
    kwargs = {"vocab_size": 50, "n_layer": 1, "n_head": 2, "n_embd": 16, "context": 8}
    return _saved(tmp_path, "gpt2", count, **kwargs)


def _vits(tmp_path: Path, count: int, **extra: str) -> list[str]:
    kwargs = {"image_size": 8, "patch_size": 4, "in_channels": 1, "num_classes": 10}
    kwargs |= {"width": 16, "depth": 1, "heads": 2, "mlp_dim": 16, **extra}
    return _saved(tmp_path, "vit", count, **kwargs)


def test_align_learned_writes_a_lower_barrier_model(checkpoints, tmp_path: Path) -> None:
    a, b, _ = checkpoints
    out = tmp_path / "learned"
    text = _invoke(
        "align",
        a,
        b,
        "--method",
        "learned",
        "--data",
        "digits",
        "--steps",
        "30",
        "--out",
        str(out),
        "--quiet",
    )
    assert f"wrote {out}" in text
    meta = json.loads((out / "config.json").read_text())
    assert "learned_matching" in json.dumps(meta)
    assert _barrier(a, str(out), tmp_path, "l.json") < 0.5 * _barrier(a, b, tmp_path, "n.json")


def test_align_learned_needs_data(checkpoints, tmp_path: Path) -> None:
    a, b, _ = checkpoints
    result = CliRunner().invoke(
        main, ["align", a, b, "--method", "learned", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == 1
    assert "--data" in result.output


def test_orthogonal_symmetry_on_an_mlp_is_a_clear_error(checkpoints, tmp_path: Path) -> None:
    a, b, _ = checkpoints
    result = CliRunner().invoke(
        main, ["align", a, b, "--symmetry", "orthogonal", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == 1
    assert "no space that admits orthogonal maps" in result.output
    assert "hidden.0" in result.output


def test_permutation_symmetry_is_weight_matching_for_an_mlp(checkpoints, tmp_path: Path) -> None:
    a, b, _ = checkpoints
    _invoke("align", a, b, "--out", str(tmp_path / "w"), "--quiet")
    _invoke("align", a, b, "--symmetry", "permutation", "--out", str(tmp_path / "p"), "--quiet")
    w, p = load(tmp_path / "w").params, load(tmp_path / "p").params
    assert all(torch.equal(w[k], p[k]) for k in w)


def test_orthogonal_symmetry_rewrites_a_layernorm_gpt2(tmp_path: Path) -> None:
    paths = _gpt2s(tmp_path, 2)
    out = tmp_path / "aligned"
    text = _invoke("align", *paths, "--symmetry", "orthogonal", "--out", str(out), "--quiet")
    assert "RMSNorm form" in text
    aligned, reference = load(out), load(out / "reference")
    assert aligned.config.kwargs["norm"] == "rms" == reference.config.kwargs["norm"]
    assert isinstance(aligned.module.symmetry_spec()["residual"].group, Orthogonal)
    # B is moved, not replaced: its function in RMSNorm form is unchanged
    original = load(paths[1])
    x = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(aligned.module(x), original.module(x), atol=1e-4, rtol=0)


def test_barrier_simplex_drops_after_universe_alignment(checkpoints, tmp_path: Path) -> None:
    outputs = {}
    for align in ("none", "weight"):
        json_path = tmp_path / f"{align}.json"
        text = _invoke(
            "barrier",
            *checkpoints,
            "--simplex",
            "--resolution",
            "4",
            "--align",
            align,
            "--data",
            "digits",
            "--json",
            str(json_path),
            "--plot",
            str(tmp_path / f"{align}.png"),
            "--quiet",
        )
        assert text.startswith("simplex of 3 models (15 points, align " + align)
        outputs[align] = json.loads(json_path.read_text())
        assert (tmp_path / f"{align}.png").read_bytes()[:4] == b"\x89PNG"
    assert outputs["weight"]["barrier_loss"] < 0.5 * outputs["none"]["barrier_loss"]
    assert outputs["weight"]["meta"]["align"] == "weight"


def test_two_model_barrier_output_is_unchanged(checkpoints) -> None:
    a, b, _ = checkpoints
    text = _invoke("barrier", a, b, "--data", "digits", "--quiet")
    lines = text.splitlines()
    assert lines[0].split() == [
        "method",
        "loss",
        "barrier",
        "acc",
        "barrier",
        "mid",
        "loss",
        "mid",
        "acc",
        "end",
        "losses",
    ]
    assert lines[2].startswith("linear")
    assert len(lines) == 3


def test_barrier_model_count_errors(checkpoints) -> None:
    result = CliRunner().invoke(main, ["barrier", *checkpoints, "--data", "digits"])
    assert result.exit_code == 1
    assert "--simplex" in result.output
    result = CliRunner().invoke(
        main, ["barrier", *checkpoints[:2], "--align", "weight", "--data", "digits"]
    )
    assert result.exit_code == 1


def test_align_bad_device_is_a_clear_error(checkpoints, tmp_path: Path) -> None:
    a, b, _ = checkpoints
    args = ["align", a, b, "--method", "learned", "--data", "digits", "--out", str(tmp_path / "x")]
    result = CliRunner().invoke(main, [*args, "--device", "nonsense"])
    assert result.exit_code == 1
    assert "--device" in result.output
    if not torch.cuda.is_available():
        result = CliRunner().invoke(main, [*args, "--device", "cuda"])
        assert result.exit_code == 1
        assert "no CUDA device" in result.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_align_learned_on_cuda(checkpoints, tmp_path: Path) -> None:
    a, b, _ = checkpoints
    out = tmp_path / "learned-cuda"
    args = ["align", a, b, "--method", "learned", "--data", "digits", "--steps", "30"]
    _invoke(*args, "--device", "cuda", "--out", str(out), "--quiet")
    assert _barrier(a, str(out), tmp_path, "l.json") < 0.5 * _barrier(a, b, tmp_path, "n.json")


def test_head_bases_flag_keeps_the_function_and_is_recorded(tmp_path: Path) -> None:
    paths = _gpt2s(tmp_path, 2)
    plain, based = tmp_path / "plain", tmp_path / "based"
    args = ["--symmetry", "orthogonal", "--no-circuits", "--out", str(plain), "--quiet"]
    _invoke("align", *paths, *args)
    args = ["--symmetry", "orthogonal", "--head-bases", "--out", str(based), "--quiet"]
    _invoke("align", *paths, *args)
    x = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    a, b = load(plain), load(based)
    torch.testing.assert_close(b.module(x), a.module(x), atol=1e-4, rtol=0)
    assert not torch.equal(
        a.params["transformer.h.0.attn.c_attn.weight"],
        b.params["transformer.h.0.attn.c_attn.weight"],
    )
    meta = json.loads((based / "config.json").read_text())
    assert '"head_bases": true' in json.dumps(meta)


def test_head_bases_on_an_mlp_is_a_clear_error(checkpoints, tmp_path: Path) -> None:
    a, b, _ = checkpoints
    result = CliRunner().invoke(main, ["align", a, b, "--head-bases", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1
    assert "head" in result.output


@pytest.mark.parametrize("flag", ["--head-bases", "--circuits"])
def test_simplex_with_head_bases_or_circuits_keeps_every_vertex(tmp_path: Path, flag: str) -> None:
    paths = _vits(tmp_path, 3, norm="rms")
    results = {}
    for flags in ([], [flag]):
        out = tmp_path / f"s{len(flags)}.json"
        args = ["--simplex", "--resolution", "2", "--align", "weight", "--data", "digits"]
        _invoke("barrier", *paths, *args, *flags, "--json", str(out), "--quiet")
        results[len(flags)] = json.loads(out.read_text())
    # neither changes any model's function: the vertices' losses are the same
    for plain, other in zip(results[0]["vertex_loss"], results[1]["vertex_loss"], strict=True):
        assert other == pytest.approx(plain, abs=1e-5)
    assert results[1]["meta"][flag.removeprefix("--").replace("-", "_")] is True
    if flag == "--head-bases":
        result = CliRunner().invoke(
            main, ["barrier", *paths, "--simplex", "--head-bases", "--data", "digits"]
        )
        assert result.exit_code == 1 and "--align weight" in result.output


def test_circuits_flag_aligns_and_measures_in_circuit_form(tmp_path: Path) -> None:
    paths = _vits(tmp_path, 2)
    out = tmp_path / "aligned"
    args = ["--symmetry", "orthogonal", "--circuits", "--out", str(out), "--quiet"]
    text = _invoke("align", *paths, *args)
    assert "RMSNorm form and circuit form" in text
    aligned, reference = load(out), load(out / "reference")
    assert aligned.config.kwargs["attention"] == "circuits" == reference.config.kwargs["attention"]
    assert isinstance(aligned.module.symmetry_spec()["residual"].group, Orthogonal)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    for rewritten, original in ((aligned, paths[1]), (reference, paths[0])):
        torch.testing.assert_close(rewritten.module(x), load(original).module(x), atol=1e-4, rtol=0)
    assert json.loads((out / "config.json").read_text())["metadata"]["circuits"] is True
    # --circuits on a pair already in circuit form changes nothing
    ref, moved = str(out / "reference"), str(out)
    assert _path(ref, moved, tmp_path, "c.json", "--circuits")["barrier_loss"] == pytest.approx(
        _barrier(ref, moved, tmp_path, "p.json"), abs=1e-6
    )
    # the unaligned pair in circuit form: same ends, another path
    plain = _path(*paths, tmp_path, "plain.json")
    circuit = _path(*paths, tmp_path, "u.json", "--circuits")
    assert circuit["loss"][0] == pytest.approx(plain["loss"][0], abs=1e-5)
    assert circuit["loss"][-1] == pytest.approx(plain["loss"][-1], abs=1e-5)
    assert circuit["meta"]["circuits"] is True


def test_circuits_flag_errors(checkpoints, tmp_path: Path) -> None:
    a, b, _ = checkpoints
    cases = [
        (["align", a, b, "--circuits", "--out", str(tmp_path / "x")], "no attention heads"),
        (["barrier", a, b, "--circuits", "--data", "digits"], "no attention heads"),
    ]
    vits = _vits(tmp_path, 2)
    out = str(tmp_path / "y")
    cases += [
        (["align", *vits, "--circuits", "--head-bases", "--out", out], "--head-bases"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1, args
        assert message in result.output, (args, result.output)
