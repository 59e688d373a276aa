"""The one runner every experiment uses: config hash, cache, device, stages, figures, result.

An experiment opens a :class:`Runner` on its config (a frozen dataclass, or a dict of
them) and does its work through it::

    run = Runner(ctx, config)                       # ctx.out_dir/quick-<hash>/ (or full-)
    module, a = run.train("mlp-seed0", build, data, train_config, seed=0)
    entry = run.stage("wm", lambda: {"path": run.path(module, a, b, data).to_dict()})
    figure = run.save_figure(fig, "paths.png")
    return run.result(table, rows, [figure], notes)

Layout under ``ctx.out_dir`` (which ``run_experiment`` marks as an lmckit output)::

    <label>-<hash>/config.json            the resolved config, seed and device
    <label>-<hash>/models/<name>/          trained models (a checkpoint for zoo models)
    <label>-<hash>/stages/seed<S>/<name>.json   per-stage results of the run with seed S

``<hash>`` is :func:`config_hash` of the config, so a changed config never reads another
config's cache; a model is also retrained when its recorded training setup (seed,
training config, task, data size, architecture) differs. A rerun of the same command
reloads what the last one finished, so an interrupted run continues where it stopped.

Device: training and the runner's path evaluations run on :attr:`Runner.device` (CUDA
when available and ``ctx.device`` is ``"auto"``; training with TF32 matrix products,
measurements in full float32); everything else in an experiment runs on the CPU and
receives CPU tensors.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from lmckit.data import batches
from lmckit.experiments._registry import ExperimentContext, ExperimentResult
from lmckit.formats import _checkpoint as checkpoint
from lmckit.measure._evaluate import PathResult, evaluate_path
from lmckit.models import ModelConfig, list_models
from lmckit.outputs._atomic import atomic_dir, atomic_path, write_json
from lmckit.outputs._own_files import plot_metadata
from lmckit.paths import SimplexResult, evaluate_simplex
from lmckit.symmetry._params import Params
from lmckit.training._task import CLASSIFICATION, Task
from lmckit.training._train import TrainConfig, TrainData, TrainResult, fit

__all__ = ["Runner", "choose_device", "config_hash"]

DEVICES = ("auto", "cpu", "cuda")


def _plain(value: object) -> Any:
    # dataclasses by field (as dataclasses.asdict), mappings by key, sequences as lists
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _dumps(config: object) -> str:
    return json.dumps(_plain(config), sort_keys=True, default=str)


def _jsonable(config: object) -> Any:
    """``config`` as plain JSON values: dataclasses by field, tuples as lists, the rest str."""
    return json.loads(_dumps(config))


def config_hash(config: object) -> str:
    """Ten hex digits of the SHA-256 of ``config``'s JSON (plain JSON values, sorted keys)."""
    return hashlib.sha256(_dumps(config).encode()).hexdigest()[:10]


def choose_device(preference: str = "auto") -> torch.device:
    """``cuda`` when asked, or available under ``auto``; else the CPU."""
    if preference not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {preference!r}")
    if preference == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but CUDA is not available")
    if preference == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


@contextmanager
def _tf32(device: torch.device) -> Iterator[None]:
    """TF32 matrix products on CUDA inside the block (training only), restored after."""
    before = torch.get_float32_matmul_precision()
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _to(params: Params, device: torch.device) -> Params:
    return {k: v.to(device) for k, v in params.items()}


def _zoo_config(module: nn.Module) -> ModelConfig | None:
    """The module's config when ``lmckit.load`` can rebuild it (a zoo model), else None."""
    config = getattr(module, "config", None)
    return config if isinstance(config, ModelConfig) and config.name in list_models() else None


class Runner:
    """One experiment run: its cache folder, device, stages, trained models and timings.

    Args:
        ctx: how to run (output folder, quick, seed, progress, log, device).
        config: everything that determines the results (hashed into the folder name).
        label: folder prefix; default ``quick`` or ``full`` after ``ctx.quick``.
    """

    def __init__(self, ctx: ExperimentContext, config: object, *, label: str | None = None):
        self.ctx = ctx
        self.config = config
        self.hash = config_hash(config)
        self.label = label or ("quick" if ctx.quick else "full")
        self.root = ctx.out_dir / f"{self.label}-{self.hash}"
        self.device = choose_device(ctx.device)
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        resolved = {"config": _jsonable(config), "seed": ctx.seed, "quick": ctx.quick}
        write_json(self.root / "config.json", resolved | {"device": str(self.device)})

    # ------------------------------------------------------------------ stages

    def stage(self, name: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``compute()`` (a JSON-able dict), cached per seed; ``stage_seconds`` added."""
        path = self.root / "stages" / f"seed{self.ctx.seed}" / f"{name}.json"
        if path.exists():
            self.ctx.log(f"[{name}] cached ({path})")
            return json.loads(path.read_text())
        self.ctx.log(f"[{name}] running")
        start = time.perf_counter()
        out = dict(compute())
        seconds = time.perf_counter() - start
        out["stage_seconds"] = seconds
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, out)
        self.ctx.log(f"[{name}] done in {seconds:.1f} s")
        self.seconds[name] = seconds
        return out

    # ------------------------------------------------------------------ models

    def train(
        self,
        name: str,
        build: Callable[[], tuple[nn.Module, Params]],
        data: TrainData,
        config: TrainConfig,
        *,
        seed: int,
        task: Task = CLASSIFICATION,
    ) -> tuple[nn.Module, Params]:
        """Train ``build()``'s module from its initial parameters, or reload the cached result.

        Args:
            name: unique within the run (e.g. ``mlp-w64-seed0``): the cache folder.
            build: returns ``(module, initial params)``; called on a reload too, for the
                module.
            data, config, seed, task: as for :func:`lmckit.training.fit`.

        Returns:
            ``(module, params)`` with the params on the CPU.
        """
        module, init = build()
        where = self.root / "models" / name
        wanted = {
            "name": name,
            "seed": seed,
            "train": _jsonable(config),
            "task": task.name,
            "data": data.name,
            "n_train": int(data.x_train.shape[0]),
            "model": _jsonable(getattr(module, "config", None)),
        }
        cached = self._reload(where, wanted, init)
        if cached is not None:
            return module, cached
        self.ctx.log(f"[train {name}] seed {seed} on {self.device}")
        start = time.perf_counter()
        with _tf32(self.device):
            result = fit(
                module,
                init,
                data,
                config,
                seed=seed,
                device=self.device,
                progress=self.ctx.progress,
                task=task,
            )
        seconds = time.perf_counter() - start
        self.seconds[f"train {name}"] = seconds
        self._save(where, module, result, {"setup": wanted, **self._summary(result, seconds)})
        self.ctx.log(f"[train {name}] {result.steps} steps in {seconds:.1f} s")
        return module, result.params

    def train_pair(
        self,
        name: str,
        build: Callable[[int], tuple[nn.Module, Params]],
        data: TrainData,
        config: TrainConfig,
        *,
        task: Task = CLASSIFICATION,
    ) -> tuple[nn.Module, Params, Params]:
        """Two models, seeds ``ctx.seed`` and ``ctx.seed + 1``: :meth:`train` of
        ``build(seed)`` as ``NAME-seedS``. Returns ``(module, params_a, params_b)``."""
        trained = []
        for seed in (self.ctx.seed, self.ctx.seed + 1):
            module, params = self.train(
                f"{name}-seed{seed}", partial(build, seed), data, config, seed=seed, task=task
            )
            trained.append(params)
        return module, trained[0], trained[1]

    def _summary(self, result: TrainResult, seconds: float) -> dict[str, Any]:
        return {
            "steps": result.steps,
            "epochs": result.epochs,
            "stopped_early": result.stopped_early,
            "best_val_loss": None if result.best is None else result.best.loss,
            "train_seconds": seconds,
            "device": str(self.device),
        }

    def _reload(self, where: Path, wanted: dict[str, Any], init: Params) -> Params | None:
        weights = where / checkpoint.WEIGHTS_FILE
        if not weights.is_file():
            return None
        try:
            meta = checkpoint.load_metadata(where)
            params = checkpoint.load_params_file(weights)
        except checkpoint.CheckpointError as err:
            self.ctx.log(f"retraining: cannot reuse {where} ({err})")
            return None
        shapes = {k: tuple(v.shape) for k, v in init.items()}
        if meta.get("setup") != wanted or {k: tuple(v.shape) for k, v in params.items()} != shapes:
            self.ctx.log(f"retraining: {where} was trained with another setup")
            return None
        self.ctx.log(f"[train {wanted['name']}] loaded {where}")
        return params

    def _save(self, where: Path, module: nn.Module, result: TrainResult, meta: dict) -> None:
        zoo = _zoo_config(module)
        if zoo is not None:  # a checkpoint lmckit.load (and the CLI) can read
            checkpoint.save(where, zoo, result.params, metadata=meta)
            return
        tensors = {k: v.detach().contiguous().clone() for k, v in result.params.items()}
        with atomic_dir(where) as tmp:
            save_file(tensors, str(tmp / checkpoint.WEIGHTS_FILE), metadata={"format": "pt"})
            write_json(tmp / checkpoint.CONFIG_FILE, {"metadata": meta})

    def model_metadata(self) -> dict[str, dict[str, Any]]:
        """The recorded metadata of every cached model, by name."""
        folder = self.root / "models"
        if not folder.is_dir():
            return {}
        return {p.name: checkpoint.load_metadata(p) for p in sorted(folder.iterdir())}

    # ------------------------------------------------------------------ measurements

    def path(
        self,
        module: nn.Module,
        params_a: Params,
        params_b: Params,
        x: Tensor,
        y: Tensor,
        *,
        batch_size: int,
        points: int = 11,
        ts: Sequence[float] | None = None,
        meta: Mapping[str, Any] | None = None,
        task: Task = CLASSIFICATION,
    ) -> PathResult:
        """The linear path from ``params_a`` to ``params_b`` on ``(x, y)``, on the device."""
        work = copy.deepcopy(module).to(self.device)
        xd, yd = x.to(self.device), y.to(self.device)
        return evaluate_path(
            work,
            _to(params_a, self.device),
            _to(params_b, self.device),
            lambda: batches(xd, yd, batch_size),
            ts=ts,
            points=points,
            meta=meta,
            progress=self.ctx.progress,
            task=task,
        )

    def simplex(
        self,
        module: nn.Module,
        models: Sequence[Params],
        x: Tensor,
        y: Tensor,
        *,
        batch_size: int,
        resolution: int,
    ) -> SimplexResult:
        """Loss over the simplex of ``models`` on ``(x, y)``, on the device."""
        work = copy.deepcopy(module).to(self.device)
        xd, yd = x.to(self.device), y.to(self.device)
        return evaluate_simplex(
            work,
            [_to(p, self.device) for p in models],
            lambda: batches(xd, yd, batch_size),
            resolution=resolution,
        )

    # ------------------------------------------------------------------ outputs

    def subplots(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """``matplotlib.pyplot.subplots`` on the file-only Agg backend; save with
        :meth:`save_figure`."""
        import matplotlib

        matplotlib.use("Agg")  # no display on servers and CI
        import matplotlib.pyplot as plt

        return plt.subplots(*args, **kwargs)

    def save_figure(self, figure: Any, name: str) -> Path:
        """Write a matplotlib figure as ``ctx.out_dir / name`` (PNG, atomically); close it."""
        import matplotlib.pyplot as plt

        path = self.ctx.out_dir / name
        with atomic_path(path) as tmp:
            figure.savefig(tmp, format="png", dpi=120, metadata=plot_metadata("png"))
        plt.close(figure)
        return path

    def result(
        self,
        table: str,
        rows: list[dict[str, Any]],
        figures: Sequence[Path] = (),
        notes: str = "",
    ) -> ExperimentResult:
        """The experiment's result; the notes get the cache folder and this run's timings."""
        wall = time.perf_counter() - self._start
        timing = json.dumps({k: round(v, 1) for k, v in self.seconds.items()})
        run_notes = (
            f"config {self.hash} ({self.label}), device {self.device}, cache {self.root}; "
            f"wall {wall:.1f} s this run; seconds this run: {timing}"
        )
        return ExperimentResult(
            table, rows, list(figures), f"{notes}; {run_notes}" if notes else run_notes
        )
