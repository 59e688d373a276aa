"""Curve folders: written whole, read back, endpoints recognised by their weights, and the
output policy's curve kind."""

from __future__ import annotations

import json

import pytest
import torch

from lmckit.formats._checkpoint import save
from lmckit.formats._curve_folder import (
    EndpointRecord,
    check_endpoint,
    params_digest,
    read_curve_folder,
    read_curve_points,
    write_curve_folder,
)
from lmckit.models import create_model
from lmckit.outputs import OutputError, check_output_dir
from lmckit.outputs._folders import CURVE_MARKER, is_lmckit_output


def test_the_digest_follows_the_values_not_the_dtype_they_are_read_in() -> None:
    _, p = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    same = {k: v.clone() for k, v in p.items()}
    assert params_digest(same) == params_digest(p)
    rounded = {k: v.to(torch.bfloat16) for k, v in p.items()}
    # a bfloat16 model read as float32 is the same model as read in bfloat16
    widened = {k: v.float() for k, v in rounded.items()}
    assert params_digest(rounded) == params_digest(widened)
    moved = dict(same)
    moved["head.bias"] = same["head.bias"].clone()
    moved["head.bias"][0] += 1e-6
    assert params_digest(moved) != params_digest(p)


def _write(out, kind="bezier", count=2, **kw):
    model, p = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    points = [{k: v + i for k, v in p.items()} for i in range(count)]
    ends = [EndpointRecord("a", "/x/a", "0" * 64), EndpointRecord("b", "/x/b", "1" * 64)]
    return write_curve_folder(out, kind, points, ends, lambda f, q: save(f, model, q),
                              info={"note": "hi"}, **kw), points  # fmt: skip


def test_a_curve_folder_reads_back_what_was_written(tmp_path) -> None:
    out, points = _write(tmp_path / "curve")
    record = read_curve_folder(out)
    assert record.kind == "bezier" and record.points == ["control-1", "control-2"]
    assert record.endpoints[1].path == "b" and record.info["note"] == "hi"
    read = read_curve_points(out, record)
    assert all(torch.equal(r[k], p[k]) for r, p in zip(read, points, strict=True) for k in p)
    band, _ = _write(tmp_path / "band", kind="neb", count=1)
    assert read_curve_folder(band).points == ["pivot-1"]


def test_the_output_policy_knows_curve_folders(tmp_path) -> None:
    out, _ = _write(tmp_path / "curve")
    assert is_lmckit_output(out, "curve") and not is_lmckit_output(out, "checkpoint")
    _write(out)  # its own kind is replaced
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a curve folder lmckit wrote"):
        check_output_dir(out, kind="curve")
    (out / "notes.txt").unlink()
    (out / "control-1" / "mine.txt").write_text("mine")  # a point that is not lmckit's
    assert not is_lmckit_output(out, "curve")
    user = tmp_path / "user"
    user.mkdir()
    (user / "data.csv").write_text("1,2")
    with pytest.raises(OutputError):
        _write(user)
    _write(user, overwrite=True)
    assert is_lmckit_output(user, "curve")


def test_malformed_records_and_moved_endpoints_are_named(tmp_path) -> None:
    out, points = _write(tmp_path / "curve")
    marker = out / CURVE_MARKER
    data = json.loads(marker.read_text())
    marker.write_text(json.dumps({**data, "points": ["control-1", "control-9"]}))
    with pytest.raises(ValueError, match="control-9"):
        read_curve_folder(out)
    marker.write_text(json.dumps({k: v for k, v in data.items() if k != "endpoints"}))
    with pytest.raises(ValueError, match="malformed"):
        read_curve_folder(out)
    with pytest.raises(ValueError, match="not a curve folder"):
        read_curve_folder(tmp_path)
    end = EndpointRecord("runs/a", "/abs/runs/a", params_digest(points[0]))
    check_endpoint(end, points[0], which="A", curve=out)
    with pytest.raises(ValueError, match="A = runs/a, whose weights have changed"):
        check_endpoint(end, points[1], which="A", curve=out)
