"""A trained curve on disk: its points in the models' format, its endpoints referenced.

``lmckit curve A B --out DIR`` writes::

    DIR/lmckit-curve.json     the record: kind, endpoints (path and digest), the form
                              the curve lives in, how it was fitted, the path measured
    DIR/control-1/ ...        Bezier control points or chain nodes, in order
    DIR/pivot-1/ ...          (an elastic band's pivots instead)

Each point is a full model in the format the curve's form is written in (a Hugging Face
folder for two Hugging Face models in their own form, else an lmckit checkpoint), so
``transformers`` or ``lmckit.load`` reads it alone. The endpoints are not copied: the
record names their paths and a digest of their weights (:func:`params_digest`), and
reading the curve back refuses endpoints whose weights changed since.

The folder is an output kind of its own (:mod:`lmckit.outputs`, ``"curve"``): written
whole into a temporary folder and renamed, and replaced only when it is an lmckit curve
folder (or with ``overwrite``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmckit.formats._io import load_model
from lmckit.hf._files import read_json_file
from lmckit.outputs import check_output_dir
from lmckit.outputs._atomic import atomic_dir, write_json
from lmckit.outputs._folders import CURVE_MARKER
from lmckit.symmetry._params import Params

__all__ = [
    "CurveRecord",
    "EndpointRecord",
    "check_endpoint",
    "is_curve_folder",
    "params_digest",
    "read_curve_folder",
    "read_curve_points",
    "write_curve_folder",
]

# the record holds a path result and a short history: a larger file is not ours
_MAX_RECORD_BYTES = 1 << 24
_VERSION = 1


def params_digest(params: Mapping[str, Tensor]) -> str:
    """SHA-256 of a parameter set: every tensor's name, shape and values (floating ones
    as float32, so a model reads the same whether loaded as stored or in float32),
    in name order; 64 hex digits."""
    h = hashlib.sha256()
    for name in sorted(params):
        value = params[name].detach().cpu()
        if value.is_floating_point():
            value = value.float()
        h.update(f"{name}|{value.dtype}|{tuple(value.shape)}\n".encode())
        h.update(value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class EndpointRecord:
    """One endpoint as the curve folder names it.

    Attributes:
        path: the path as given to ``lmckit curve``.
        resolved: its absolute path then.
        digest: :func:`params_digest` of its weights then.
    """

    path: str
    resolved: str
    digest: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "resolved": self.resolved, "digest": self.digest}


@dataclass(frozen=True)
class CurveRecord:
    """What a curve folder's marker says.

    Attributes:
        kind: ``bezier``, ``chain`` or ``neb``.
        points: the point folders, in order along the curve.
        endpoints: A and B.
        info: everything else (form, fit settings and timings, the measured path).
    """

    kind: str
    points: list[str]
    endpoints: list[EndpointRecord]
    info: dict[str, Any] = field(default_factory=dict)


def point_names(kind: str, count: int) -> list[str]:
    """The folder names of ``count`` points of a curve of ``kind``."""
    stem = "pivot" if kind == "neb" else "control"
    return [f"{stem}-{i + 1}" for i in range(count)]


def write_curve_folder(
    out: str | os.PathLike[str],
    kind: str,
    points: Sequence[Params],
    endpoints: Sequence[EndpointRecord],
    write_point: Callable[[Path, Params], object],
    *,
    info: Mapping[str, Any] | None = None,
    inputs: Sequence[str | os.PathLike[str]] = (),
    overwrite: bool = False,
) -> Path:
    """Write a curve folder (module docstring) atomically; returns ``out``.

    Args:
        out: the folder (checked against the output policy, kind ``"curve"``).
        kind: the curve's kind.
        points: its control points or pivots, in order.
        endpoints: A and B.
        write_point: ``(folder, params) -> ...`` writes one point in the models' format.
        info: stored in the record (JSON values).
        inputs: paths the command read (never overwritten).
        overwrite: replace a non-empty folder lmckit did not write.
    """
    target = check_output_dir(out, kind="curve", inputs=inputs, force=overwrite)
    names = point_names(kind, len(points))
    record = {
        "lmckit_curve": _VERSION,
        "kind": kind,
        "points": names,
        "endpoints": [e.to_dict() for e in endpoints],
        **dict(info or {}),
        "files": [CURVE_MARKER],
        "folders": names,
    }
    with atomic_dir(target) as tmp:
        for name, params in zip(names, points, strict=True):
            write_point(tmp / name, params)
        write_json(tmp / CURVE_MARKER, record)  # last: the folder is a curve once complete
    return target


def is_curve_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder holding a curve marker."""
    return (Path(path) / CURVE_MARKER).is_file()


def read_curve_folder(path: str | os.PathLike[str]) -> CurveRecord:
    """The record of the curve folder at ``path``.

    Raises:
        ValueError: not a curve folder, or a record that is malformed (named).
    """
    folder = Path(path)
    marker = folder / CURVE_MARKER
    if not marker.is_file():
        raise ValueError(
            f"{folder} is not a curve folder (no {CURVE_MARKER}); write one with `lmckit curve`"
        )
    data = read_json_file(marker, max_bytes=_MAX_RECORD_BYTES, what=CURVE_MARKER)
    try:
        kind, names = str(data["kind"]), [str(n) for n in data["points"]]
        ends = [
            EndpointRecord(str(e["path"]), str(e["resolved"]), str(e["digest"]))
            for e in data["endpoints"]
        ]
    except (KeyError, TypeError) as err:
        raise ValueError(f"{marker} is malformed: {err!r}") from None
    if len(ends) != 2 or not names:
        raise ValueError(f"{marker} is malformed: it needs two endpoints and at least one point")
    for name in names:
        if Path(name).name != name or not (folder / name).is_dir():
            raise ValueError(f"{marker} names the point {name!r}, which {folder} lacks")
    skip = {"kind", "points", "endpoints", "files", "folders", "lmckit_curve"}
    return CurveRecord(kind, names, ends, {k: v for k, v in data.items() if k not in skip})


def read_curve_points(path: str | os.PathLike[str], record: CurveRecord) -> list[Params]:
    """The curve's points, read as float32 (checked like any model: safely, by shape)."""
    return [load_model(Path(path) / name).params for name in record.points]


def check_endpoint(
    record: EndpointRecord,
    params: Mapping[str, Tensor],
    *,
    which: str,
    curve: str | os.PathLike[str],
) -> None:
    """Refuse an endpoint whose weights differ from those the curve was fitted between.

    Raises:
        ValueError: naming the curve, the endpoint and both digests' first digits.
    """
    digest = params_digest(params)
    if digest != record.digest:
        raise ValueError(
            f"the curve {curve} was fitted from {which} = {record.path}, whose weights have "
            f"changed since (digest {digest[:12]} now, {record.digest[:12]} then): fit the "
            "curve again"
        )
