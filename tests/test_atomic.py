"""Atomic writes leave either the old output or the complete new one, and no leftovers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lmckit.outputs._atomic import atomic_dir, atomic_path, write_json, write_text


class Boom(Exception):
    pass


def test_atomic_path_replaces_on_success(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_text("new")
        assert target.read_text() == "old"  # not visible until the block ends
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_atomic_path_exception_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    with pytest.raises(Boom), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise Boom
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_exception_keeps_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(Boom), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise Boom
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_atomic_path_creates_parents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.txt"
    write_text(target, "hi")
    assert target.read_text() == "hi"


def test_write_json_roundtrip_and_order(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    write_json(target, {"b": 1, "a": [1.5, None]})
    text = target.read_text()
    assert json.loads(text) == {"b": 1, "a": [1.5, None]}
    assert text.index('"b"') < text.index('"a"')  # keys keep their order


def test_write_json_nan_names_path_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    with pytest.raises(ValueError, match="x.json"):
        write_json(target, {"loss": math.nan})
    assert list(tmp_path.iterdir()) == []


def _fill(d: Path, content: str) -> None:
    (d / "f.txt").write_text(content)
    (d / "sub").mkdir()
    (d / "sub" / "g.txt").write_text(content)


def test_atomic_dir_creates(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with atomic_dir(target) as tmp:
        assert tmp.parent == tmp_path and tmp.is_dir() and not any(tmp.iterdir())
        _fill(tmp, "new")
        assert not target.exists()
    assert (target / "sub" / "g.txt").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_atomic_dir_replaces_existing(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    _fill(target, "old")
    (target / "stale.txt").write_text("only in the old one")
    with atomic_dir(target) as tmp:
        _fill(tmp, "new")
    assert (target / "f.txt").read_text() == "new"
    assert not (target / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_atomic_dir_exception_keeps_existing(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    _fill(target, "old")
    with pytest.raises(Boom), atomic_dir(target) as tmp:
        _fill(tmp, "half")
        raise Boom
    assert (target / "f.txt").read_text() == "old"
    assert (target / "sub" / "g.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_atomic_dir_exception_without_existing(tmp_path: Path) -> None:
    with pytest.raises(Boom), atomic_dir(tmp_path / "ckpt") as tmp:
        _fill(tmp, "half")
        raise Boom
    assert list(tmp_path.iterdir()) == []
