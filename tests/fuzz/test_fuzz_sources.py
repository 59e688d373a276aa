"""What lmckit reads and writes about its sources (issue 43, items 6 and 7): remote code,
text its tokenizer does not know, the licenses of a merge's two models, and the record
of a merged point written from Python."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import lmckit
from lmckit.cli import main
from lmckit.data import load_data
from lmckit.hf import HFError

transformers = pytest.importorskip("transformers")

REMOTE = "configuration and model code this folder says transformers should run"


def _run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def _with_config(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    doc = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**doc, **changes}))
    return dst


# ------------------------------------------------------------ item 6: remote code


def _remote(world: Path, dst: Path) -> Path:
    """``hf/gpt_a`` declaring custom model code (``auto_map``) whose class name is stock."""
    folder = _with_config(
        world / "hf" / "gpt_a",
        dst,
        auto_map={"AutoModelForCausalLM": "modeling_mine.GPT2LMHeadModel"},
    )
    (folder / "modeling_mine.py").write_text(f"# {REMOTE}\nraise SystemExit('ran')\n")
    return folder


def test_remote_code_folder_is_refused_on_loading(world, tmp_path) -> None:
    folder = _remote(world, tmp_path / "remote")
    with pytest.raises(HFError, match="auto_map sends AutoModelForCausalLM to custom code"):
        lmckit.load_model(folder)
    code, out = _run("align", folder, world / "hf" / "gpt_b", "--out", tmp_path / "o", "--quiet")
    assert code == 1 and "lmckit never runs remote code" in out, out
    assert not (tmp_path / "o").exists()
    code, out = _run("symmetries", folder)
    assert code == 1 and "custom code (modeling_mine.GPT2LMHeadModel)" in out, out


def test_custom_tokenizer_code_alone_is_not_model_code(world, tmp_path) -> None:
    folder = _with_config(
        world / "hf" / "gpt_a",
        tmp_path / "tok_only",
        auto_map={"AutoTokenizer": ["tokenization_mine.MyTokenizer", None]},
    )
    assert lmckit.load_model(folder).format == "hf"


# ------------------------------------------------------- item 7: unknown tokens


def test_text_of_unknown_tokens_is_refused(world, tmp_path) -> None:
    text = tmp_path / "french.txt"
    text.write_text(" ".join(["le chat noir"] * 200))
    spec = f"text:{text},tokenizer={world / 'data' / 'tok'},block=8"
    with pytest.raises(ValueError, match=r"600 of its 600 tokens \(100%\) are unknown"):
        load_data(spec)
    ckpt = world / "ckpt"
    code, out = _run("barrier", ckpt / "gpt_ok", ckpt / "gpt_ok2", "--data", spec, "--quiet")
    assert code == 1 and "are unknown to" in out and "<unk>" in out, out


def test_text_with_some_unknown_tokens_is_accepted(world, tmp_path) -> None:
    text = tmp_path / "mostly.txt"
    text.write_text(" ".join(["the cat sat on the mat and a dog"] * 100))  # 1 in 9 unknown
    data = load_data(f"text:{text},tokenizer={world / 'data' / 'tok'},block=8")
    assert data.num_classes == 9


# -------------------------------------------------- item 7: the licenses of a merge


def _carded(src: Path, dst: Path, license: str) -> Path:
    folder = shutil.copytree(src, dst)
    (folder / "README.md").write_text(f"---\nlicense: {license}\ntags:\n- x\n---\n\n# {dst.name}\n")
    return folder


def test_merged_card_carries_both_licenses(world, tmp_path) -> None:
    a = _carded(world / "hf" / "gpt_a", tmp_path / "a", "mit")
    b = _carded(world / "hf" / "gpt_b", tmp_path / "b", "apache-2.0")
    code, out = _run("merge", a, b, "--out", tmp_path / "m")
    assert code == 0, out
    card = (tmp_path / "m" / "README.md").read_text()
    front = card.split("\n---\n")[0]
    assert "license: other" in front and "license_name: mit AND apache-2.0" in front
    assert "tags:" in front and "license: mit\n" not in front
    assert f"- {a}: mit" in card and f"- {b}: apache-2.0" in card


def test_merged_card_of_one_license_keeps_it(world, tmp_path) -> None:
    a = _carded(world / "hf" / "gpt_a", tmp_path / "a", "mit")
    b = _carded(world / "hf" / "gpt_b", tmp_path / "b", "mit")
    code, out = _run("merge", a, b, "--out", tmp_path / "m")
    assert code == 0, out
    assert (tmp_path / "m" / "README.md").read_text().startswith("---\nlicense: mit\n")


# ------------------------------------------------ item 7: a merged point's record


def test_python_merge_records_its_provenance(world, tmp_path) -> None:
    a, b = world / "ckpt" / "a", world / "ckpt" / "b"
    merged = lmckit.align(a, b).merge(0.25)
    merged.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "config.json").read_text())["metadata"]
    assert meta["a"] == str(a) and meta["b"] == str(b) and meta["t"] == 0.25
    assert meta["alignment"]["method"] == "weight_matching"
    assert meta["reset_bn"] is False and meta["repair"] is False


def test_python_merge_of_folders_records_and_carries_licenses(world, tmp_path) -> None:
    a = _carded(world / "hf" / "gpt_a", tmp_path / "a", "mit")
    b = _carded(world / "hf" / "gpt_b", tmp_path / "b", "apache-2.0")
    lmckit.align(a, b, circuits=False).merge(0.5).save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "lmckit.json").read_text())["metadata"]
    assert meta["a"] == str(a) and meta["b"] == str(b) and meta["t"] == 0.5
    assert "license_name: apache-2.0 AND mit" in (tmp_path / "m" / "README.md").read_text()
