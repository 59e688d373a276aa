"""A pair's records checked against its files (issue 43, items 3, 4 and 5).

An ``lmckit align --symmetry orthogonal`` output of a Llama folder keeps the class and
the config: its norm scales are folded (all ones) and its stream rotated. ``merge`` and
``barrier`` measure it against A put in the same form, as its ``lmckit.json`` says. These
cases take the record away, edit it, or pair it with a model the record does not
describe; and a folder storing float32 norms beside bfloat16 weights is aligned.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tests.tiny_models import build_hf_folder

from lmckit.cli import main

transformers = pytest.importorskip("transformers")


def _run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def _logits(folder: Path) -> torch.Tensor:
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    x = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(x).logits


def _edit_json(folder: Path, name: str, edit) -> Path:
    doc = json.loads((folder / name).read_text())
    edit(doc)
    (folder / name).write_text(json.dumps(doc))
    return folder


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Llama A and B, B aligned to A under rotations (``al``), its weights copied without
    ``lmckit.json`` (``copy``), its record with ``form_choice`` edited (``edited``), and
    A and the aligned B merged as recorded (``m_al``)."""
    root = tmp_path_factory.mktemp("records")
    a = build_hf_folder("llama", root / "a", seed=0)
    b = build_hf_folder("llama", root / "b", seed=1)
    code, out = _run("align", a, b, "--symmetry", "orthogonal", "--max-sweeps", "2",
                     "--out", root / "al", "--quiet")  # fmt: skip
    assert code == 0, out
    copy = root / "copy"
    copy.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(root / "al" / name, copy / name)
    edited = shutil.copytree(root / "al", root / "edited")
    _edit_json(edited, "lmckit.json", lambda d: d["metadata"]["form_choice"].update(symmetry=None))
    code, out = _run("merge", a, root / "al", "--out", root / "m_al")
    assert code == 0, out
    return {"root": root, "a": a, "b": b, "al": root / "al", "copy": copy, "edited": edited}


# ------------------------------------------------------------- item 4: the record


@pytest.mark.parametrize("variant", ["copy", "edited"])
def test_folded_b_without_its_record_merges_as_with_it(pair, variant) -> None:
    root = pair["root"]
    code, out = _run("merge", pair["a"], pair[variant], "--out", root / f"m_{variant}")
    assert code == 0, out
    reference, got = _logits(root / "m_al"), _logits(root / f"m_{variant}")
    assert float((reference - got).abs().max()) < 1e-5
    assert "is in the folded form" in out


def test_a_record_the_weights_contradict_is_refused(pair, tmp_path) -> None:
    """B's own (unfolded) weights beside the aligned output's lmckit.json."""
    fake = shutil.copytree(pair["b"], tmp_path / "fake")
    shutil.copy(pair["al"] / "lmckit.json", fake / "lmckit.json")
    code, out = _run("merge", pair["a"], fake, "--out", tmp_path / "m")
    assert code == 1 and out.count("\n") == 1, out
    assert "lmckit.json says its norm scales are folded, but" in out
    assert "is not at its folded value" in out
    assert not (tmp_path / "m").exists()


# ------------------------------------------------------ item 3: config and storage


def test_recorded_form_still_compares_configs(pair, tmp_path) -> None:
    relu = shutil.copytree(pair["a"], tmp_path / "a_relu")
    _edit_json(relu, "config.json", lambda d: d.update(hidden_act="relu"))
    code, out = _run("merge", relu, pair["al"], "--out", tmp_path / "m")
    assert code == 1, out
    assert "their configs differ in hidden_act: 'relu' vs 'silu'" in out
    assert not (tmp_path / "m").exists()


def test_recorded_form_still_compares_storage(pair, tmp_path) -> None:
    """The aligned B stored in bfloat16 (its record kept) beside a float32 A."""
    low = shutil.copytree(pair["al"], tmp_path / "al16")
    weights = low / "model.safetensors"
    state = {k: v.to(torch.bfloat16) for k, v in load_file(weights).items()}
    save_file(state, str(weights), metadata={"format": "pt"})
    _edit_json(low, "config.json", lambda d: d.update(dtype="bfloat16"))
    code, out = _run("merge", pair["a"], low, "--out", tmp_path / "m")
    assert code == 1, out
    assert "stored in different dtypes (float32 and bfloat16)" in out
    assert not (tmp_path / "m").exists()


# ------------------------------------------------- item 5: mixed storage dtypes


def _mixed(path: Path, seed: int) -> Path:
    """A bfloat16 Llama whose norm scales are stored in float32 (values bfloat16 cannot
    hold), as models with ``_keep_in_fp32_modules`` ship."""
    build_hf_folder("llama", path, seed=seed, dtype=torch.bfloat16)
    weights = path / "model.safetensors"
    gen = torch.Generator().manual_seed(seed)
    state = {
        k: 1 + 0.1 * torch.randn(v.shape, generator=gen) if "norm" in k else v
        for k, v in load_file(weights).items()
    }
    save_file(state, str(weights), metadata={"format": "pt"})
    return path


def _dtypes(folder: Path) -> dict[str, str]:
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return {k: f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118


def test_mixed_storage_dtypes_are_kept_per_tensor(tmp_path) -> None:
    a, b = _mixed(tmp_path / "a", 0), _mixed(tmp_path / "b", 1)
    out = tmp_path / "out"
    code, text = _run("align", a, b, "--symmetry", "permutation", "--out", out, "--quiet")
    assert code == 0, text
    assert _dtypes(out) == _dtypes(b)
    assert set(_dtypes(b).values()) == {"BF16", "F32"}
    # a permutation moves values without rounding: B's function, read as stored
    reference, got = _logits(b), _logits(out)
    assert float((reference - got).abs().max() / reference.abs().max()) < 1e-5
    card = (out / "README.md").read_text()
    assert "bfloat16 (float32: 5 weights)" in card
