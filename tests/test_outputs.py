"""Outputs never destroy inputs or a user's folders: library checks and every writing command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import lmckit
from lmckit.cli import main
from lmckit.models import create_model
from lmckit.outputs import OutputError, check_output_dir, check_output_file
from lmckit.outputs._folders import RUN_MARKER, is_lmckit_output


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under ``root`` with its bytes (``None`` for folders)."""
    out: dict[str, bytes | None] = {".": None}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = path.read_bytes() if path.is_file() else None
    return out


def _ckpt(path: Path, seed: int = 0) -> Path:
    model, params = create_model("mlp", seed=seed, in_features=64, hidden=[8], out_features=10)
    lmckit.save(path, model, params)
    return path


def _user_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("my notes")
    (path / "sub").mkdir()
    (path / "sub" / "data.bin").write_bytes(b"\x00\x01")
    return path


# --------------------------------------------------------------------------- library


def test_new_and_empty_folders_are_accepted(tmp_path) -> None:
    assert check_output_dir(tmp_path / "new" / "deeper", kind="checkpoint") == (
        tmp_path / "new" / "deeper"
    )
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty", kind="checkpoint")
    assert not (tmp_path / "new").exists()  # checking creates nothing


def test_an_lmckit_checkpoint_may_be_replaced_but_not_one_holding_user_files(tmp_path) -> None:
    ckpt = _ckpt(tmp_path / "c")
    assert is_lmckit_output(ckpt, "checkpoint")
    check_output_dir(ckpt, kind="checkpoint")
    (ckpt / "mine.txt").write_text("keep me")
    assert not is_lmckit_output(ckpt, "checkpoint")
    with pytest.raises(OutputError, match="not an lmckit checkpoint"):
        check_output_dir(ckpt, kind="checkpoint")


def test_a_user_folder_is_refused_unless_forced(tmp_path) -> None:
    folder = _user_folder(tmp_path / "mine")
    with pytest.raises(OutputError, match=r"refusing to replace .*mine.*2 entries: notes.txt, sub"):
        check_output_dir(folder, kind="checkpoint")
    check_output_dir(folder, kind="checkpoint", force=True)


@pytest.mark.parametrize("relation", ["same", "inside", "contains"])
def test_outputs_overlapping_an_input_are_refused_even_with_force(tmp_path, relation) -> None:
    inp = _ckpt(tmp_path / "in" / "a")
    out = {"same": inp, "inside": inp / "x", "contains": tmp_path / "in"}[relation]
    with pytest.raises(OutputError, match="input"):
        check_output_dir(out, kind="checkpoint", inputs=[inp], force=True)


def test_overlap_is_seen_through_relative_paths_and_symlinks(tmp_path, monkeypatch) -> None:
    inp = _ckpt(tmp_path / "a")
    (tmp_path / "link").symlink_to(inp)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match="it is an input"):
        check_output_dir("./a/../a", kind="checkpoint", inputs=["link"])


def test_working_directory_and_its_parents_are_never_outputs(tmp_path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for out in (".", str(work), "..", ""):
        with pytest.raises(OutputError):
            check_output_dir(out, kind="checkpoint", force=True)


def test_files_symlinks_and_unwritable_places_are_refused(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="a file of that name exists"):
        check_output_dir(tmp_path / "file", kind="checkpoint", force=True)
    with pytest.raises(OutputError, match="is not a folder"):
        check_output_dir(tmp_path / "file" / "sub", kind="checkpoint")
    (tmp_path / "link").symlink_to(_ckpt(tmp_path / "target"))
    with pytest.raises(OutputError, match="symbolic link"):
        check_output_dir(tmp_path / "link", kind="checkpoint")


def test_experiment_folders_are_recognised_by_their_marker(tmp_path) -> None:
    folder = _user_folder(tmp_path / "runs")
    with pytest.raises(OutputError, match="not an lmckit experiment folder"):
        check_output_dir(folder, kind="experiment")
    (folder / RUN_MARKER).write_text('{"experiment": "demo"}')
    check_output_dir(folder, kind="experiment")
    # a checkpoint is not an experiment folder, nor the other way round
    assert not is_lmckit_output(_ckpt(tmp_path / "c"), "experiment")
    assert not is_lmckit_output(folder, "checkpoint")


def test_output_files_inside_inputs_or_of_unknown_type_are_refused(tmp_path) -> None:
    inp = _ckpt(tmp_path / "a")
    with pytest.raises(OutputError, match="inside the input"):
        check_output_file(inp / "config.json", inputs=[inp])
    with pytest.raises(OutputError, match="unknown file type '.xyz'"):
        check_output_file(tmp_path / "p.xyz", suffixes=[".png", ".pdf"])
    with pytest.raises(OutputError, match="it is a folder"):
        check_output_file(inp)
    (tmp_path / "old.json").write_text("{}")
    # a file lmckit did not write is replaced only when asked (--force)
    with pytest.raises(OutputError, match="a file lmckit did not write"):
        check_output_file(tmp_path / "old.json", inputs=[inp])
    check_output_file(tmp_path / "old.json", inputs=[inp], force=True)


# --------------------------------------------------------------------------- command line


def _invoke(*args: str | Path):
    return CliRunner().invoke(main, [str(a) for a in args])


def _refused(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.output.startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    return _ckpt(tmp_path / "a", 0), _ckpt(tmp_path / "b", 1)


TRAIN = ["train", "--model", "mlp", "--data", "digits", "--width", "8", "--depth", "1",
         "--epochs", "1", "--quiet"]  # fmt: skip


def test_train_refuses_a_user_folder_and_leaves_it_intact(tmp_path) -> None:
    folder = _user_folder(tmp_path / "mine")
    before = snapshot(folder)
    _refused(_invoke(*TRAIN, "--out", folder), "refusing to replace", "--force")
    assert snapshot(folder) == before


def test_train_replaces_its_own_checkpoint_and_force_replaces_a_user_folder(tmp_path) -> None:
    out = _ckpt(tmp_path / "c")
    assert _invoke(*TRAIN, "--out", out).exit_code == 0
    assert lmckit.load(out).config.kwargs["hidden"] == [8]
    folder = _user_folder(tmp_path / "mine")
    assert _invoke(*TRAIN, "--out", folder, "--force").exit_code == 0
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


def test_train_refuses_the_working_directory(tmp_path, monkeypatch) -> None:
    _user_folder(tmp_path / "work")
    monkeypatch.chdir(tmp_path / "work")
    before = snapshot(tmp_path / "work")
    for out in (".", str(tmp_path / "work"), ""):
        _refused(_invoke(*TRAIN, "--out", out, "--force"))
    assert snapshot(tmp_path / "work") == before


def test_train_refuses_to_write_over_its_data(tmp_path) -> None:
    data = _user_folder(tmp_path / "mnist")
    before = snapshot(data)
    args = [a if a != "digits" else f"mnist:{data}" for a in TRAIN]
    _refused(_invoke(*args, "--out", data, "--force"), "input")
    assert snapshot(data) == before


@pytest.mark.parametrize(
    "command",
    [
        ["merge", "{a}", "{b}", "--out", "{a}"],
        ["merge", "{a}", "{b}", "--out", "{b}", "--force"],
        ["align", "{a}", "{b}", "--out", "{b}"],
        ["align", "{a}", "{b}", "--out", "{a}/nested", "--force"],
        ["barrier", "{a}", "{b}", "--data", "digits", "--json", "{a}/config.json"],
        ["barrier", "{a}", "{b}", "--data", "digits", "--plot", "{b}/model.safetensors"],
    ],
)
def test_commands_never_write_over_their_inputs(pair, command) -> None:
    a, b = pair
    before = snapshot(a.parent)
    args = [c.format(a=a, b=b) for c in command]
    _refused(_invoke(*args, "--quiet") if command[0] != "merge" else _invoke(*args), "input")
    assert snapshot(a.parent) == before


def test_unknown_plot_type_is_refused_before_any_work(pair, tmp_path) -> None:
    a, b = pair
    result = _invoke("barrier", a, b, "--data", "digits", "--plot", tmp_path / "p.xyz", "--quiet")
    _refused(result, "unknown file type '.xyz'")
    _refused(_invoke("demo", "--plot", tmp_path / "p.nope", "--quiet"), "unknown file type")
    assert not (tmp_path / "p.xyz").exists()


def test_align_and_merge_write_into_new_folders(pair, tmp_path) -> None:
    a, b = pair
    assert _invoke("align", a, b, "--out", tmp_path / "al", "--quiet").exit_code == 0
    assert _invoke("merge", a, tmp_path / "al", "--out", tmp_path / "m").exit_code == 0
    assert is_lmckit_output(tmp_path / "m", "checkpoint")


def test_reproduce_refuses_a_user_folder(tmp_path) -> None:
    folder = _user_folder(tmp_path / "runs")
    before = snapshot(folder)
    _refused(_invoke("reproduce", "mnist-mlp", "--quick", "--out", folder), "experiment folder")
    assert snapshot(folder) == before


def test_unwritable_output_is_reported_before_training(tmp_path) -> None:
    (tmp_path / "f").write_text("x")
    result = _invoke(*TRAIN, "--out", tmp_path / "f" / "c", "--epochs", "50")
    _refused(result, "is not a folder")
    assert os.path.getsize(tmp_path / "f") == 1
