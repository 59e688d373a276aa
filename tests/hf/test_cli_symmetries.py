"""`lmckit symmetries` on Hugging Face folders: the report matches the model's algebra."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from lmckit.cli import main
from lmckit.forms._recipe import aligned_form
from lmckit.hf import load_hf
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import apply


def _run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def test_the_report_names_exactly_the_parameters_a_random_symmetry_moves(
    family, hf_folder, tmp_path
) -> None:
    folder = hf_folder(family)
    code, out = _run("symmetries", folder, "--json", tmp_path / "r.json")
    assert code == 0, out
    report = json.loads((tmp_path / "r.json").read_text())
    model = load_hf(folder)
    form = aligned_form(model.module, model.params, model.params)
    moved = apply(form.spec, form.a, random_transform(form.spec, seed=3))
    changed = {k for k in form.a if not torch.equal(moved[k], form.a[k])}
    assert set(report["fixed"]) == set(form.a) - changed
    assert report["moved_elements"] == sum(form.a[k].numel() for k in changed)
    assert [s["name"] for s in report["spaces"]] == list(form.spec.names)
    for space in report["spaces"]:  # every space is a row of the printed table...
        if space["parent"] is None:
            assert f"  {space['name']} " in out
        else:  # ...or, nested in the units of another, counted in its kind's row
            count = sum(s["parent"] == space["parent"] and s["kind"] == space["kind"]
                        for s in report["spaces"])  # fmt: skip
            label = f"{space['kind']} x{count}" if count > 1 else space["kind"]
            assert f"    {label} " in out


def test_grouped_query_heads_are_permuted_by_key_value_group(hf_folder) -> None:
    # the tiny Llama has 4 query heads sharing 2 key/value heads: its head spaces
    # permute the 2 groups (each carrying its 2 query heads); inside each group, its 2
    # query heads permute, and its value basis and rotary query/key planes rotate
    code, out = _run("symmetries", hf_folder("llama"))
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.startswith("  heads.")]
    assert rows == [["heads.0", "Permutation", "2", "4"], ["heads.1", "Permutation", "2", "4"]]
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  heads.0"))
    nested = [line.split() for line in lines[start + 1 : start + 4]]
    assert nested == [
        ["query", "x2", "HeadPermutation(2", "x", "8)", "16", "2"],
        ["value", "x2", "Orthogonal", "8", "2"],
        ["qk", "x2", "RotaryPlanes(8)", "8", "2"],
    ]
    assert "5 spaces and 14 nested in their units" in lines[0]  # and 2 gated-unit scalings


def test_orthogonal_folds_the_norm_scales_of_an_rmsnorm_model(hf_folder, tmp_path) -> None:
    code, out = _run(
        "symmetries", hf_folder("llama"), "--symmetry", "orthogonal", "--json", tmp_path / "r"
    )
    assert code == 0, out
    report = json.loads((tmp_path / "r").read_text())
    assert report["form"] == "norm scales folded"
    groups = {s["name"]: s["group"] for s in report["spaces"]}
    assert groups["residual"] == "Orthogonal"
    # the folded scales (all ones now) are not reported as parameters alignment leaves
    assert len(report["folded"]) == 5 and not set(report["folded"]) & set(report["fixed"])
    assert all(key.endswith("norm.weight") for key in report["folded"])
    assert out.splitlines()[0].endswith(
        "nested in their units under orthogonal (norm scales folded)"
    )


def test_orthogonal_on_a_layernorm_encoder_is_one_line_saying_why(hf_folder) -> None:
    code, out = _run("symmetries", hf_folder("bert"), "--symmetry", "orthogonal")
    assert code == 1
    assert "Traceback" not in out
    assert len(out.strip().splitlines()) == 1
    assert "LayerNorm" in out


@pytest.mark.parametrize("inside", [".", "sub"])
def test_a_report_inside_the_model_folder_is_refused_before_loading(
    hf_folder, tmp_path, inside
) -> None:
    folder = Path(hf_folder("gpt2"))
    before = sorted(p.name for p in folder.iterdir())
    code, out = _run("symmetries", folder, "--json", folder / inside / "report.json")
    assert code != 0 and "Traceback" not in out
    assert "input" in out
    assert sorted(p.name for p in folder.iterdir()) == before
