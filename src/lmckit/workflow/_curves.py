"""Curves between two loaded models: fit one, write it, read it back.

A curve is fitted in the form its pair's path is measured in (:func:`path_form`: the
form ``lmckit align`` recorded, e.g. heads as QK/OV circuits), so a curve between A and
an aligned B bends from where the straight line of ``lmckit barrier`` runs. Its points
are written in that form's format (the models' own format when the form is their own
architecture, else an lmckit checkpoint), beside a record naming the endpoints and a
digest of their weights (:mod:`lmckit.formats._curve_folder`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmckit.data import Dataset, batches
from lmckit.data._fit import check_data_fits
from lmckit.formats._checkpoint import save as save_checkpoint
from lmckit.formats._curve_folder import (
    CurveRecord,
    EndpointRecord,
    check_endpoint,
    params_digest,
    read_curve_folder,
    read_curve_points,
    write_curve_folder,
)
from lmckit.formats._io import LoadedModel, check_same_architecture, load_model, save_model
from lmckit.measure._evaluate import PathResult, linear_grid
from lmckit.measure._measure import (
    MERGE_METHOD_OF_FIX,
    EvalSettings,
    measure_path,
    resolve_fix,
    train_inputs,
)
from lmckit.merging._methods import path_prepare
from lmckit.models import ZooModel
from lmckit.paths._curves import CURVE_KINDS, Curve, CurveLike, evaluate_curve, fit_curve
from lmckit.paths._neb import Band, BandConfig, fit_band
from lmckit.runtime._distributed import computed_once
from lmckit.symmetry._params import IncompatibleModelsError, Params
from lmckit.training._train import TrainConfig
from lmckit.workflow._pair import PathForm, path_form

__all__ = [
    "CURVE_FIXES",
    "KINDS",
    "CurveSettings",
    "FittedCurve",
    "LoadedCurve",
    "fit_pair_curve",
    "load_curve",
    "point_prepare",
    "save_curve",
]

#: What ``lmckit curve --kind`` fits.
KINDS = (*CURVE_KINDS, "neb")
#: The fixes a point of a curve or plane admits (REPAIR's targets are a line's).
CURVE_FIXES = ("auto", "none", "reset_bn")


def default_train_config(kind: str) -> TrainConfig:
    """Adam 1e-3 for Bezier curves and chains (Garipov et al.'s curves train like
    networks); SGD with Nesterov momentum 0.9, lr 0.02, for bands (Draxler et al. ran
    SGD with momentum, from 0.1 down; 0.1 diverged between Adam-trained MNIST MLPs)."""
    if kind == "neb":
        return TrainConfig(epochs=10, optimizer="sgd", lr=0.02)
    return TrainConfig(epochs=10, optimizer="adam", lr=1e-3)


@dataclass(frozen=True)
class CurveSettings:
    """How a curve is fitted.

    Attributes:
        kind: ``bezier``, ``chain`` or ``neb``.
        bends: control points of a Bezier curve or chain.
        train: optimiser, epochs, batch size (default :func:`default_train_config`).
        band: pivots, cycles and spring of a band (default :class:`BandConfig`).
        seed: data order and the curve's ``t`` samples.
        max_seconds: stop training after this much wall time.
    """

    kind: str = "bezier"
    bends: int = 1
    train: TrainConfig | None = None
    band: BandConfig | None = None
    seed: int = 0
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.bends < 1:
            raise ValueError(f"bends must be >= 1, got {self.bends}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be positive, got {self.max_seconds}")

    @property
    def config(self) -> TrainConfig:
        return self.train or default_train_config(self.kind)

    def planned_steps(self, data: Dataset) -> int:
        """Optimiser steps a run to the end takes."""
        config = self.config
        total = config.epochs * -(-len(data.x_train) // config.batch_size)
        return total if config.max_steps is None else min(total, config.max_steps)


def point_prepare(
    module: Any, form: PathForm, data: Dataset, settings: EvalSettings
) -> Callable[[Params, float], Params] | None:
    """The fix applied at every point of a curve or plane (``auto``: a BatchNorm reset
    where there is BatchNorm), checked; ``None`` when there is none."""
    if settings.fix not in CURVE_FIXES:
        raise ValueError(
            f"fix must be one of {', '.join(CURVE_FIXES)} off the straight line (REPAIR "
            f"interpolates the endpoints' statistics along a line), got {settings.fix!r}"
        )
    fix = resolve_fix(module, settings.fix)
    return path_prepare(
        MERGE_METHOD_OF_FIX[fix], module, form.a, form.b, train_inputs(data, settings)
    )


@dataclass(frozen=True)
class FittedCurve:
    """A curve fitted between two models and measured.

    Attributes:
        form: the pair in the form the curve lives in.
        curve: the curve or band.
        path: loss and metric along it.
        line: the straight line's, for comparison.
        seconds: wall time of the fit.
        planned_steps: optimiser steps a run to the end takes (``curve.steps`` says how
            many were taken: fewer when ``max_seconds`` stopped it).
    """

    form: PathForm
    curve: CurveLike
    path: PathResult
    line: PathResult
    seconds: float
    planned_steps: int

    @property
    def steps(self) -> int:
        return int(getattr(self.curve, "steps", 0))


def _fit(form: PathForm, data: Dataset, settings: CurveSettings, progress: bool) -> CurveLike:
    if settings.kind == "neb":
        # every process takes part: the pivots of each step are split between them
        return fit_band(
            form.module,
            form.a,
            form.b,
            data,
            settings.config,
            settings.band,
            seed=settings.seed,
            max_seconds=settings.max_seconds,
            progress=progress,
        )
    # one sample of t per step, each step depending on the last: one process fits
    return computed_once(
        lambda: fit_curve(
            form.module,
            form.a,
            form.b,
            data,
            settings.config,
            kind=settings.kind,
            bends=settings.bends,
            seed=settings.seed,
            max_seconds=settings.max_seconds,
            progress=progress,
        )
    )


def measure_curve(
    form: PathForm,
    curve: CurveLike,
    data: Dataset,
    settings: EvalSettings,
    *,
    meta: dict[str, Any] | None = None,
    progress: bool = False,
) -> PathResult:
    """Loss and metric along ``curve`` on the settings' split, grid and fix."""
    prepare = point_prepare(form.module, form, data, settings)
    x, y = data.split(settings.split)
    size = settings.batch_for(data)
    fix = resolve_fix(form.module, settings.fix)
    return evaluate_curve(
        form.module,
        curve,
        lambda: batches(x, y, size),
        ts=linear_grid(settings.points),
        prepare=prepare,
        meta={"split": settings.split, "fix": fix, **(meta or {})},
        progress=progress,
    )


def fit_pair_curve(
    a: LoadedModel,
    b: LoadedModel,
    data: Dataset,
    settings: CurveSettings | None = None,
    evaluation: EvalSettings | None = None,
    *,
    circuits: bool | None = None,
    meta: dict[str, Any] | None = None,
    progress: bool = False,
) -> FittedCurve:
    """Fit a curve from ``a`` to ``b`` on ``data``'s training split, and measure it and the
    straight line on ``evaluation``'s split (in the form :func:`path_form` gives)."""
    settings = settings or CurveSettings()
    evaluation = evaluation or EvalSettings()
    form = path_form(a, b, circuits=circuits)
    check_data_fits(form.module, data)
    point_prepare(form.module, form, data, evaluation)  # a fix the points refuse: now
    start = time.perf_counter()
    curve = _fit(form, data, settings, progress)
    seconds = time.perf_counter() - start
    info = {**(meta or {}), "circuits": form.circuits}
    if form.choice is not None:
        info["form_choice"] = form.choice.to_dict()
    line = measure_path(
        form.module,
        form.a,
        form.b,
        data,
        evaluation,
        meta={**info, "method": "linear"},
        progress=progress,
    )
    path = measure_curve(
        form, curve, data, evaluation, meta={**info, "method": settings.kind}, progress=progress
    )
    return FittedCurve(form, curve, path, line, seconds, settings.planned_steps(data))


def _endpoint(model: LoadedModel, given: str | os.PathLike[str]) -> EndpointRecord:
    return EndpointRecord(str(given), str(Path(given).resolve()), params_digest(model.params))


def _point_writer(a: LoadedModel, form: PathForm) -> Callable[[Path, Params], object]:
    """Writes one point in the form's format: A's own, or an lmckit checkpoint of the
    form's zoo model."""
    if form.same_as_a:
        return lambda folder, params: save_model(folder, a, params)
    module = form.module
    if not isinstance(module, ZooModel):
        raise ValueError(f"cannot write points of a {type(module).__name__} as a checkpoint")
    return lambda folder, params: save_checkpoint(folder, module, params)


def save_curve(
    out: str | os.PathLike[str],
    fitted: FittedCurve,
    a: LoadedModel,
    b: LoadedModel,
    paths: Sequence[str | os.PathLike[str]],
    *,
    info: dict[str, Any] | None = None,
    inputs: Sequence[str | os.PathLike[str]] = (),
    overwrite: bool = False,
) -> Path:
    """Write ``fitted`` as a curve folder; ``paths`` are A's and B's paths as given."""
    form = fitted.form
    record = {
        "circuits": form.circuits,
        "form_choice": form.choice.to_dict() if form.choice is not None else None,
        "steps": fitted.steps,
        "planned_steps": fitted.planned_steps,
        "fit_seconds": round(fitted.seconds, 3),
        "history": list(getattr(fitted.curve, "history", ())),
        "path": fitted.path.to_dict(),
        "linear": fitted.line.to_dict(),
        **(info or {}),
    }
    if isinstance(fitted.curve, Band):
        record["inserted"] = list(fitted.curve.inserted)
    ends = [_endpoint(a, paths[0]), _endpoint(b, paths[1])]
    return write_curve_folder(
        out,
        fitted.curve.kind,
        fitted.curve.controls,
        ends,
        _point_writer(a, form),
        info=record,
        inputs=inputs,
        overwrite=overwrite,
    )


@dataclass(frozen=True)
class LoadedCurve:
    """A curve folder read back, its endpoints checked.

    Attributes:
        path: the folder.
        record: its record.
        form: the endpoints in the curve's form.
        curve: the curve or band, between ``form.a`` and ``form.b``.
        a, b: the endpoints as loaded.
    """

    path: Path
    record: CurveRecord
    form: PathForm
    curve: CurveLike
    a: LoadedModel
    b: LoadedModel

    @property
    def middle(self) -> Params:
        """The middle control point (of an even number, the later of the middle two)."""
        controls = self.curve.controls
        return controls[len(controls) // 2]


def _endpoints_of(record: CurveRecord, folder: Path) -> tuple[LoadedModel, LoadedModel]:
    """The endpoints read from the paths the record names."""
    models = []
    for which, end in zip(("A", "B"), record.endpoints, strict=True):
        if not Path(end.resolved).exists():
            raise FileNotFoundError(
                f"the curve {folder} was fitted from {which} = {end.path} ({end.resolved}), "
                "which is no longer there: give the endpoints, or fit the curve again"
            )
        models.append(load_model(end.resolved))
    return models[0], models[1]


def load_curve(
    folder: str | os.PathLike[str],
    a: LoadedModel | None = None,
    b: LoadedModel | None = None,
) -> LoadedCurve:
    """Read a curve folder; its endpoints are ``a`` and ``b`` when given, else read from
    the paths it records. Either way their weights must be those it was fitted between.

    Raises:
        ValueError: not a curve folder, a malformed record, endpoints whose weights
            changed, or points that do not fit the endpoints (each named).
        FileNotFoundError: a recorded endpoint is gone.
    """
    where = Path(folder)
    record = read_curve_folder(where)
    if record.kind not in KINDS:
        raise ValueError(f"{where}: unknown curve kind {record.kind!r}")
    if a is None or b is None:
        a, b = _endpoints_of(record, where)
        if record.info.get("form_choice") is None:
            check_same_architecture(a, b)
    for which, model, end in zip(("A", "B"), (a, b), record.endpoints, strict=True):
        check_endpoint(end, model.params, which=which, curve=where)
    circuits = record.info.get("circuits")
    form = path_form(a, b, circuits=bool(circuits) if circuits is not None else None)
    points = read_curve_points(where, record)
    curve: CurveLike
    try:
        if record.kind == "neb":
            names = tuple(n for n, _ in form.module.named_parameters())
            curve = Band(form.a, tuple(points), form.b, names)
        else:
            curve = Curve(record.kind, form.a, tuple(points), form.b)
    except IncompatibleModelsError as err:
        raise ValueError(
            f"the points of the curve {where} do not fit its endpoints: {err}"
        ) from None
    return LoadedCurve(where, record, form, curve, a, b)
