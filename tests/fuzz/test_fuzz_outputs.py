"""The library writers keep the command line's output rules: nothing they did not write is lost.

``lmckit.save``, ``lmckit.save_model`` (both formats) and the plots go through the one
output policy (:mod:`lmckit.outputs`): a folder lmckit did not write is replaced only
with ``overwrite=True``; the working directory, its parents and the model's own folder
never; a ``reference/`` subfolder must itself be lmckit's. Each case checks the files
around it byte for byte.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import lmckit
from lmckit.measure._evaluate import PathResult
from lmckit.measure._plot import plot_paths
from lmckit.models import create_model
from lmckit.outputs import OutputError

MLP, PARAMS = create_model("mlp", seed=0, in_features=64, hidden=[6], out_features=10)


def _user_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "thesis.tex").write_text("\\chapter{mine}")
    (path / "figs").mkdir()
    (path / "figs" / "plot.pdf").write_bytes(b"%PDF")
    return path


@pytest.mark.parametrize("writer", ["save", "save_model"])
def test_a_project_folder_is_not_replaced(tmp_path: Path, snap, writer: str) -> None:
    proj = _user_folder(tmp_path / "proj")
    like = lmckit.load_model(lmckit.save(tmp_path / "src", MLP, PARAMS))
    before = snap(tmp_path)
    with pytest.raises(OutputError, match=r"refusing to replace .*proj.*thesis.tex"):
        if writer == "save":
            lmckit.save(proj, MLP, PARAMS)
        else:
            lmckit.save_model(proj, like, PARAMS)
    assert snap(tmp_path) == before
    # asked for: replaced (the command line's --force)
    lmckit.save(proj, MLP, PARAMS, overwrite=True)
    assert sorted(p.name for p in proj.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("where", [".", "..", "abs-parent"])
def test_the_working_directory_and_its_parents_are_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snap, where: str
) -> None:
    work = _user_folder(tmp_path / "parent" / "work")
    monkeypatch.chdir(work)
    target = os.path.abspath("..") if where == "abs-parent" else where
    before = snap(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="working directory or one of its parents"):
            lmckit.save(target, MLP, PARAMS, overwrite=overwrite)
    assert snap(tmp_path) == before


def test_a_model_is_never_written_over_its_own_folder(tmp_path: Path, snap) -> None:
    like = lmckit.load_model(lmckit.save(tmp_path / "a", MLP, PARAMS))
    before = snap(tmp_path)
    for target in (tmp_path / "a", tmp_path / "a" / "nested", tmp_path):
        with pytest.raises(OutputError, match="input"):
            lmckit.save_model(target, like, PARAMS, overwrite=True)
    assert snap(tmp_path) == before


def test_a_reference_subfolder_must_be_lmckits_own(tmp_path: Path, snap) -> None:
    ck = lmckit.save(tmp_path / "ck", MLP, PARAMS)
    lmckit.save(ck / "reference", MLP, PARAMS)
    lmckit.save(ck, MLP, PARAMS)  # lmckit's checkpoint with lmckit's reference: replaced
    assert not (ck / "reference").exists()
    (ck / "reference").mkdir()
    (ck / "reference" / "mydata.txt").write_text("keep me")
    before = snap(tmp_path)
    with pytest.raises(OutputError, match=r"its reference/ is not a folder lmckit wrote"):
        lmckit.save(ck, MLP, PARAMS)
    assert snap(tmp_path) == before
    # a reference that is an lmckit checkpoint holding a user's file is not lmckit's either
    (ck / "reference" / "mydata.txt").unlink()
    lmckit.save(ck / "reference", MLP, PARAMS)
    (ck / "reference" / "mydata.txt").write_text("keep me")
    with pytest.raises(OutputError, match="reference/"):
        lmckit.save(ck, MLP, PARAMS)
    # and nor is a symbolic link, nor a folder where lmckit writes a file
    (ck / "reference" / "mydata.txt").unlink()
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors").mkdir()
    (ck / "model.safetensors" / "mine").write_text("x")
    with pytest.raises(OutputError, match="not an lmckit checkpoint"):
        lmckit.save(ck, MLP, PARAMS)


def test_a_plot_never_replaces_a_folder(tmp_path: Path) -> None:
    result = PathResult(t=[0.0, 0.5, 1.0], loss=[1.0, 2.0, 1.0], acc=[0.5, 0.4, 0.5])
    folder = _user_folder(tmp_path / "fig.png")
    with pytest.raises(OutputError, match="it is a folder"):
        plot_paths({"x": result}, folder)
    assert (folder / "thesis.tex").exists()
    with pytest.raises(OutputError, match="unknown file type"):
        plot_paths({"x": result}, tmp_path / "fig.docx")
