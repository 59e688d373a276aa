"""A Hugging Face folder in is a folder out, whatever form it was aligned in.

GPT-2 and ViT folders are aligned in lmckit's own forms (the circuit form, the RMSNorm
form): ``lmckit align`` still writes a folder of B's class that ``from_pretrained``
loads and that computes B's outputs, the form recorded for ``barrier`` and ``merge``
(``tests/hf/test_cli_best_form.py``: the barrier on it is the form's path to 1e-5). A
permutation planted from GPT-2's own layout, written here without lmckit, is undone in
the class: the folder written holds model A's weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from lmckit.cli import main
from lmckit.workflow._pair import recorded_metadata

#: B's outputs from the folder written, against B's own: at most this far apart.
ATOL = 1e-4


def _invoke(*args: object) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def _inputs(family: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    if family == "vit":
        return torch.randn(3, 3, 8, 8, generator=gen)
    return torch.randint(0, 61, (3, 16), generator=gen)


def _outputs(load, family: str, folder: Path) -> torch.Tensor:
    with torch.no_grad():
        return load(family, folder)(_inputs(family)).logits


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, make_hf_folder):
    root = tmp_path_factory.mktemp("folders")
    built = {}
    for family in ("gpt2", "vit"):
        built[family] = tuple(
            make_hf_folder(family, root / f"{family}-{seed}", seed=seed) for seed in (0, 1)
        )
    return built


@pytest.mark.parametrize(
    "name, symmetry",
    [("gpt2", None), ("gpt2", "permutation"), ("gpt2", "orthogonal"), ("vit", "orthogonal")],
)
def test_a_folder_in_is_a_folder_of_b_class_out(
    pairs, load_with_transformers, tmp_path, name, symmetry
) -> None:
    family = name  # ("family" would run the test once per family: tests/hf/conftest.py)
    a, b = pairs[family]
    out = tmp_path / "out"
    extra = ["--symmetry", symmetry] if symmetry else []
    printed = _invoke("align", a, b, "--out", out, *extra)
    assert "cannot be written as" not in printed
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    got = _outputs(load_with_transformers, family, out)
    want = _outputs(load_with_transformers, family, b)
    assert float((got - want).abs().max()) < ATOL
    # aligned in lmckit's circuit form, written in the class, the form recorded
    meta = recorded_metadata(out)
    assert meta["stored_form"] == "class" and meta["form_choice"]["to_zoo"]
    assert meta["form_steps"][0] == "to_zoo" and "circuits" in meta["form_steps"]
    # an orthogonal stream is written with the norm scales folded, A beside it so
    assert (out / "reference").is_dir() == (symmetry == "orthogonal")
    if symmetry == "orthogonal":
        ref = _outputs(load_with_transformers, family, out / "reference")
        torch.testing.assert_close(ref, _outputs(load_with_transformers, family, a),
                                   atol=ATOL, rtol=0)  # fmt: skip


def _planted(a: Path, b: Path, heads: int, seed: int) -> None:
    """``b``: GPT-2 folder ``a`` with its residual units, each layer's heads and MLP units
    permuted, written from GPT-2's layout (Conv1D weights are ``(in, out)``; the head
    ``h`` of ``c_attn``'s query, key and value blocks is columns ``h d:(h + 1) d``)."""
    state = load_file(a / "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    width = state["transformer.wte.weight"].shape[1]
    res = torch.randperm(width, generator=gen)
    out = dict(state)
    out["transformer.wte.weight"] = state["transformer.wte.weight"][:, res]
    out["transformer.wpe.weight"] = state["transformer.wpe.weight"][:, res]
    for key in [k for k in state if ".ln_" in k or k.startswith("transformer.ln_f")]:
        out[key] = state[key][res]
    layers = sorted({k.split(".")[2] for k in state if k.startswith("transformer.h.")})
    for i in layers:
        pre = f"transformer.h.{i}."
        d = width // heads
        head = torch.randperm(heads, generator=gen)
        cols = torch.cat([head[h] * d + torch.arange(d) for h in range(heads)])
        qkv = torch.cat([cols + block * width for block in range(3)])
        out[pre + "attn.c_attn.weight"] = state[pre + "attn.c_attn.weight"][res][:, qkv]
        out[pre + "attn.c_attn.bias"] = state[pre + "attn.c_attn.bias"][qkv]
        out[pre + "attn.c_proj.weight"] = state[pre + "attn.c_proj.weight"][cols][:, res]
        out[pre + "attn.c_proj.bias"] = state[pre + "attn.c_proj.bias"][res]
        inner = state[pre + "mlp.c_fc.weight"].shape[1]
        unit = torch.randperm(inner, generator=gen)
        out[pre + "mlp.c_fc.weight"] = state[pre + "mlp.c_fc.weight"][res][:, unit]
        out[pre + "mlp.c_fc.bias"] = state[pre + "mlp.c_fc.bias"][unit]
        out[pre + "mlp.c_proj.weight"] = state[pre + "mlp.c_proj.weight"][unit][:, res]
        out[pre + "mlp.c_proj.bias"] = state[pre + "mlp.c_proj.bias"][res]
    b.mkdir()
    for file in a.iterdir():
        if file.name != "model.safetensors":
            (b / file.name).write_bytes(file.read_bytes())
    save_file({k: v.contiguous() for k, v in out.items()}, str(b / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip


@pytest.mark.parametrize("symmetry", [None, "permutation"])
def test_a_planted_permutation_is_undone_in_the_class(
    pairs, load_with_transformers, tmp_path, symmetry
) -> None:
    a = pairs["gpt2"][0]
    b = tmp_path / "b"
    _planted(a, b, heads=2, seed=5)
    planted = _outputs(load_with_transformers, "gpt2", b)
    torch.testing.assert_close(
        planted, _outputs(load_with_transformers, "gpt2", a), atol=ATOL, rtol=0
    )  # fmt: skip (the plant keeps the function)
    out = tmp_path / "out"
    extra = ["--symmetry", symmetry] if symmetry else []
    _invoke("align", a, b, "--out", out, *extra)
    assert recorded_metadata(out)["form_choice"]["name"] == "circuits"  # aligned as circuits
    got, want = load_file(out / "model.safetensors"), load_file(a / "model.safetensors")
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)
