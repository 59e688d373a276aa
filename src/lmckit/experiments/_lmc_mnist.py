"""Core measurements on MNIST: barriers by alignment method and merge fix.

* ``mnist-mlp``: two 784-512-512-512-10 ReLU MLPs (Adam 1e-3, 10 epochs, batch 128);
  test loss/accuracy barriers of the naive path, weight matching and activation
  matching (Ainsworth et al., 2023, "Git Re-Basin").
* ``resnet20-mnist``: two ResNet20 x4 with BatchNorm (SGD, cosine, wd 5e-4); naive and
  weight-matched paths, each with a BatchNorm reset and with REPAIR (Jordan et al.,
  2023, "REPAIR").
* ``resnet20-ln-mnist``: the same with LayerNorm (``GroupNorm(1, C)``), whose fix is
  REPAIR (there are no running statistics to reset).

Data: ``ctx.data("mnist")`` read by :func:`lmckit.data.load_mnist` (with only the
10k t10k images: first 8,000 train, last 2,000 test). Trained models are cached by the
runner (:mod:`lmckit.experiments._runner`) and reused by a rerun of the same setup.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmckit.data import Dataset, batches
from lmckit.experiments._compare import align_pair, compare_alignments
from lmckit.experiments._datasets import mnist_subset
from lmckit.experiments._registry import ExperimentContext, ExperimentResult, register_experiment
from lmckit.experiments._runner import Runner
from lmckit.experiments._tables import path_row
from lmckit.measure._evaluate import PathResult
from lmckit.measure._measure import EvalSettings, measure_path, path_table
from lmckit.measure._plot import plot_paths
from lmckit.merging._merge import has_batchnorm, reset_batchnorm
from lmckit.models import ZooModel, create_model
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import apply
from lmckit.training._train import TrainConfig

__all__ = ["ModelSetup", "trained_pair"]


@dataclass(frozen=True)
class ModelSetup:
    """What to train and how to measure it.

    Attributes:
        model: zoo name.
        model_kwargs: constructor arguments (JSON-serialisable).
        train_size: first ``train_size`` images of MNIST's training split
            (``None``: all 8,000).
        test_size: first ``test_size`` images of the test split (``None``: all 2,000).
        train: optimisation settings.
        eval: path measurement settings.
    """

    model: str
    model_kwargs: dict[str, Any]
    train_size: int | None
    test_size: int | None
    train: TrainConfig
    eval: EvalSettings


_MLP_KWARGS = {"in_features": 784, "out_features": 10}
#: The core measurements' MLP: 784-512-512-512-10 ReLU, Adam 1e-3, 10 epochs, batch 128.
_MLP_FULL = ModelSetup(
    "mlp",
    {**_MLP_KWARGS, "hidden": [512, 512, 512]},
    None,
    None,
    TrainConfig(epochs=10, batch_size=128, optimizer="adam", lr=1e-3),
    EvalSettings(),
)
MLP_QUICK = ModelSetup(
    "mlp",
    {**_MLP_KWARGS, "hidden": [128, 128]},
    2000,
    500,
    TrainConfig(epochs=3, batch_size=128, optimizer="adam", lr=1e-3),
    EvalSettings(stat_batches=4),
)

# Cost on 2 CPU cores (idle machine): one SGD step of ResNet20 x4 on 128 MNIST images
# takes ~1.75 s (~14 ms per image, ~2 minutes per epoch of 8,000), a forward pass ~5 ms
# per image. The full run trains 2 epochs (126 steps) per model, at lr 0.05: lr 0.1
# with a 2-step warm-up did not train in our runs. Paths are measured at 11 points on
# the first 1,000 test images; BatchNorm reset and REPAIR see 2 batches of 250
# training images (every pixel is a sample of each channel: plenty for the statistics).
_RESNET_KWARGS = {"in_channels": 1, "num_classes": 10}
_RESNET_TRAIN = TrainConfig(
    epochs=2, batch_size=128, optimizer="sgd", lr=0.05, weight_decay=5e-4, warmup=0.1
)
_RESNET_EVAL = EvalSettings(points=11, batch_size=250, stat_batches=2)


def _full_resnet(norm: str, train: TrainConfig) -> ModelSetup:
    return ModelSetup(
        "resnet20",
        {**_RESNET_KWARGS, "width_mult": 4, "norm": norm},
        None,
        1000,
        train,
        _RESNET_EVAL,
    )


_RESNET_FULL = _full_resnet("batch", _RESNET_TRAIN)
# LayerNorm ResNets do not train with the BatchNorm schedule (2 epochs of SGD 0.05 left
# them at 38 % / 34 % test accuracy): Adam with a warm-up instead
_RESNET_LN_TRAIN = TrainConfig(
    epochs=3, batch_size=128, optimizer="adamw", lr=2e-3, weight_decay=5e-4, warmup=0.1
)
_RESNET_LN_FULL = _full_resnet("layer", _RESNET_LN_TRAIN)


def _quick_resnet(norm: str) -> ModelSetup:
    return ModelSetup(
        "resnet20",
        {**_RESNET_KWARGS, "width_mult": 1, "norm": norm},
        256,
        200,
        TrainConfig(epochs=1, batch_size=32, optimizer="sgd", lr=0.05, weight_decay=5e-4),
        EvalSettings(points=3, batch_size=100, stat_batches=1),
    )


def trained_pair(run: Runner, setup: ModelSetup, data: Dataset) -> tuple[ZooModel, Params, Params]:
    """Models of seeds ``seed`` and ``seed + 1`` (trained, or reloaded from the run's cache).

    BatchNorm statistics are recomputed on the training set after training: they lag the
    weights, badly so after a short run at a high learning rate (eval accuracy near chance
    in our runs), so each endpoint becomes the model it was trained to be.
    """
    module, a, b = run.train_pair(
        setup.model,
        lambda seed: create_model(setup.model, seed=seed, **setup.model_kwargs),
        data,
        setup.train,
    )
    if has_batchnorm(module):
        stats = [x for x, _ in batches(data.x_train, data.y_train, 500)]
        a, b = (reset_batchnorm(module, p, stats) for p in (a, b))
    return module, a, b  # type: ignore[return-value]


def _notes(setup: ModelSetup, data: Dataset) -> str:
    return (
        f"{setup.model} {setup.model_kwargs}; trained on {len(data.x_train)} images, "
        f"tested on {len(data.x_test)}; {setup.train}"
    )


@register_experiment("mnist-mlp", paper="Ainsworth et al. 2023, Git Re-Basin (MNIST MLP)")
def mnist_mlp(ctx: ExperimentContext) -> ExperimentResult:
    """MNIST MLP 784-512x3-10: barriers of naive, weight and activation matching."""
    setup = MLP_QUICK if ctx.quick else _MLP_FULL
    run = Runner(ctx, setup)
    data = mnist_subset(ctx, setup.train_size, setup.test_size)
    model, a, b = trained_pair(run, setup, data)
    ctx.log("aligning and measuring paths")
    results = compare_alignments(
        model,
        model.symmetry_spec(),
        a,
        b,
        data,
        setup.eval,
        seed=ctx.seed,
        progress=ctx.progress,
    )
    figure = plot_paths(
        results,
        ctx.out_dir / "paths.png",
        title="MNIST MLP: linear paths (test split)",
        overwrite=True,  # inside lmckit's own experiment folder
    )
    rows = [path_row(name, r, key="path") for name, r in results.items()]
    wm = results["weight_matching"].meta
    table = path_table(results) + (
        f"\nweight matching: {wm['align_sweeps']} sweeps, {wm['align_seconds']:.2f} s"
    )
    return run.result(table, rows, [figure], _notes(setup, data))


def _fixed_paths(
    ctx: ExperimentContext, setup: ModelSetup, fixes: Sequence[tuple[str, str]]
) -> ExperimentResult:
    """Naive and weight-matched paths, each measured under every ``(label, fix)``."""
    run = Runner(ctx, {"setup": setup, "fixes": fixes})
    data = mnist_subset(ctx, setup.train_size, setup.test_size)
    model, a, b = trained_pair(run, setup, data)
    spec = model.symmetry_spec()
    ctx.log("weight matching")
    wm = align_pair("weight_matching", model, spec, a, b, data, seed=ctx.seed)
    if wm is None:  # only "naive" returns no alignment
        raise RuntimeError("weight matching returned no transform")
    ends = {"naive": b, "weight_matching": apply(spec, b, wm.transform)}
    results: dict[str, PathResult] = {}
    for method, b_aligned in ends.items():
        for label, fix in fixes:
            ctx.log(f"measuring {method} + {label}")
            settings = dataclasses.replace(setup.eval, fix=fix)
            meta: dict[str, Any] = {"method": method}
            if method == "weight_matching":
                meta |= {"align_seconds": round(wm.seconds, 4), "align_sweeps": wm.iterations}
            results[f"{method} + {label}"] = measure_path(
                model, a, b_aligned, data, settings, meta=meta, progress=ctx.progress
            )
    norm = setup.model_kwargs["norm"]
    figure = plot_paths(
        results,
        ctx.out_dir / "paths.png",
        title=f"ResNet20 x{setup.model_kwargs['width_mult']} ({norm} norm) on MNIST",
        overwrite=True,  # inside lmckit's own experiment folder
    )
    rows = [path_row(name, r, key="path") for name, r in results.items()]
    table = path_table(results) + (f"\nweight matching: {wm.iterations} sweeps, {wm.seconds:.2f} s")
    return run.result(table, rows, [figure], _notes(setup, data))


@register_experiment("resnet20-mnist", paper="Jordan et al. 2023, REPAIR; Git Re-Basin")
def resnet20_mnist(ctx: ExperimentContext) -> ExperimentResult:
    """ResNet20 x4 (BatchNorm) on MNIST: naive vs weight matching, BN reset vs REPAIR."""
    setup = _quick_resnet("batch") if ctx.quick else _RESNET_FULL
    return _fixed_paths(ctx, setup, [("BN reset", "reset_bn"), ("REPAIR", "repair")])


@register_experiment("resnet20-ln-mnist", paper="Jordan et al. 2023, REPAIR")
def resnet20_ln_mnist(ctx: ExperimentContext) -> ExperimentResult:
    """ResNet20 x4 (LayerNorm) on MNIST: naive vs weight matching, plain vs REPAIR."""
    setup = _quick_resnet("layer") if ctx.quick else _RESNET_LN_FULL
    return _fixed_paths(ctx, setup, [("no fix", "none"), ("REPAIR", "repair")])
