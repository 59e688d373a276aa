"""Around a pair: the loss on the plane through three models, curve ensembles, soups.

The plane and the ensemble are measured in the form the pair's path is (:func:`path_form`),
each point fixed as a path's points are (a BatchNorm reset where there is BatchNorm).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lmckit.data import Dataset, batches
from lmckit.data._fit import check_data_fits
from lmckit.formats._io import LoadedModel
from lmckit.measure._evaluate import Metrics
from lmckit.measure._measure import EvalSettings, resolve_fix
from lmckit.paths._ensemble import EnsembleResult, ensemble_metrics, even_ts
from lmckit.paths._plane import PlaneResult, evaluate_plane, plane_axes, plane_frame
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import IncompatibleModelsError, Params
from lmckit.workflow._curves import LoadedCurve, point_prepare
from lmckit.workflow._pair import PathForm, path_form

__all__ = ["CURVE_DRAW_POINTS", "PlaneInputs", "curve_ensemble", "pair_landscape", "plane_inputs"]

#: Points of a curve projected onto a plane to draw it.
CURVE_DRAW_POINTS = 41


@dataclass(frozen=True)
class PlaneInputs:
    """Three models in one form, ready for :func:`pair_landscape`.

    Attributes:
        form: A and B in the form their path is measured in.
        c: the third model (or a curve's middle control point) in that form.
        curve: a curve between A and B to draw, if the third came from one.
    """

    form: PathForm
    c: Params
    curve: LoadedCurve | None = None


def _same(p: Params, q: Params) -> bool:
    return p.keys() == q.keys() and all(torch.equal(p[k], q[k]) for k in p)


def plane_inputs(
    a: LoadedModel, b: LoadedModel, c: LoadedModel | LoadedCurve, *, circuits: bool | None = None
) -> PlaneInputs:
    """A, B and the third model (or a curve folder's middle control point) in one form.

    Raises:
        IncompatibleModelsError: the three are different architectures, or A takes
            different forms beside B and beside C (B and C aligned in different forms).
    """
    if isinstance(c, LoadedCurve):
        return PlaneInputs(c.form, c.middle, c)
    form = path_form(a, b, circuits=circuits)
    other = path_form(a, c, circuits=form.circuits)
    try:
        if type(other.module) is not type(form.module):
            raise IncompatibleModelsError(
                f"{type(form.module).__name__} vs {type(other.module).__name__}"
            )
        same = _same(dict(form.a), dict(other.a))
    except IncompatibleModelsError as err:
        raise IncompatibleModelsError(f"{a.path}, {b.path} and {c.path}: {err}") from None
    if not same:
        raise IncompatibleModelsError(
            f"{a.path} takes one form beside {b.path} and another beside {c.path}: align B "
            "and C to A with the same options"
        )
    return PlaneInputs(form, dict(other.b))


def pair_landscape(
    inputs: PlaneInputs,
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    resolution: int = 21,
    margin: float = 0.2,
    labels: Sequence[str] = ("A", "B", "C"),
    meta: dict[str, Any] | None = None,
    progress: bool = False,
) -> PlaneResult:
    """Loss and metric over the plane through A, B and C (:mod:`lmckit.paths._plane`).

    Args:
        inputs: from :func:`plane_inputs`.
        data: evaluation data (the settings' split); BatchNorm statistics of each plane
            point are recomputed on its training split (fix ``auto``).
        settings: split, fix (``auto``, ``none``, ``reset_bn``), batch size.
        resolution: grid points per axis (2 to 301).
        margin: the grid reaches this fraction of the models' extent beyond them.
        labels: the three models' names in the result.
        meta, progress: extra metadata; progress bar.

    Raises:
        ValueError: a bad resolution or margin, or three collinear models (before any
            evaluation).
    """
    settings = settings or EvalSettings()
    form = inputs.form
    check_data_fits(form.module, data)
    names = [n for n, _ in form.module.named_parameters()]
    models = [dict(form.a), dict(form.b), inputs.c]
    frame = plane_frame(*models, names=names)
    xs, ys = plane_axes(frame, resolution, margin)
    line_prepare = point_prepare(form.module, form, data, settings)
    prepare = None if line_prepare is None else (lambda p, _xy: line_prepare(p, float("nan")))
    curve = []
    if inputs.curve is not None:
        curve = [inputs.curve.curve.point(t) for t in even_ts(CURVE_DRAW_POINTS)]
    x, y = data.split(settings.split)
    size = settings.batch_for(data)
    info = {
        **(meta or {}),
        "split": settings.split,
        "fix": resolve_fix(form.module, settings.fix),
        "resolution": resolution,
        "margin": margin,
        "frame": {"b_x": frame.b_x, "c_x": frame.c_x, "c_y": frame.c_y},
        "curve_kind": inputs.curve.curve.kind if inputs.curve is not None else None,
    }
    return evaluate_plane(
        form.module,
        models,
        frame,
        lambda: batches(x, y, size),
        xs=xs,
        ys=ys,
        labels=labels,
        prepare=prepare,
        curve=curve,
        meta=info,
        progress=progress,
    )


def curve_ensemble(
    loaded: LoadedCurve,
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    points: int = 5,
    combine: str = "logits",
    meta: dict[str, Any] | None = None,
    progress: bool = False,
) -> EnsembleResult:
    """The ensemble of ``points`` evenly spaced points of a trained curve (both endpoints
    included), beside each endpoint, the pair ensemble of A and B and their uniform soup,
    on the settings' split; interior points and the soup get the settings' fix."""
    settings = settings or EvalSettings()
    form = loaded.form
    check_data_fits(form.module, data)
    ts = even_ts(points)
    prepare = point_prepare(form.module, form, data, settings)

    def fixed(theta: Params, t: float) -> Params:
        return theta if prepare is None else prepare(theta, t)

    a, b = dict(form.a), dict(form.b)
    members = [a, *(fixed(loaded.curve.point(t), t) for t in ts[1:-1]), b]
    members.append(fixed(interpolate(a, b, 0.5), 0.5))
    k = len(ts)
    groups = [list(range(k)), [0], [k - 1], [0, k - 1], [k]]
    x, y = data.split(settings.split)
    size = settings.batch_for(data)
    measured: list[Metrics] = ensemble_metrics(
        form.module,
        members,
        groups,
        lambda: batches(x, y, size),
        combine=combine,
        progress=progress,
    )
    info = {
        **(meta or {}),
        "curve": str(loaded.path),
        "kind": loaded.curve.kind,
        "points": points,
        "combine": combine,
        "split": settings.split,
        "fix": resolve_fix(form.module, settings.fix),
    }
    return EnsembleResult(measured[0], measured[1:3], measured[3], measured[4], ts, info)
