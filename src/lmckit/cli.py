"""The ``lmckit`` command line: parse, validate, call the library, write artifacts.

Command names, options and output formats are a contract; keep them stable.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import click
import torch

from lmckit.atomic import write_json
from lmckit.checkpoint import Checkpoint, CheckpointError, load, save
from lmckit.compare import EvalSettings, align_pair, format_table, measure_path, train_inputs
from lmckit.data import DATA_SPEC_HELP, Dataset, load_data
from lmckit.merge import has_batchnorm, repair, reset_batchnorm
from lmckit.models import create_model
from lmckit.params import IncompatibleModelsError, check_compatible, interpolate
from lmckit.symmetry import apply
from lmckit.train import OPTIMIZERS, TrainConfig, train

MODEL_CHOICES = ("mlp", "vgg", "resnet20")
NORMS = ("auto", "none", "batch", "layer", "group")


def _fail(message: str) -> click.ClickException:
    return click.ClickException(message)


def _run(fn, *args: Any, **kwargs: Any) -> Any:
    """Call library code; turn its documented errors into clean CLI errors (exit 1)."""
    try:
        return fn(*args, **kwargs)
    except (
        ValueError,
        KeyError,
        FileNotFoundError,
        NotImplementedError,
        FloatingPointError,
    ) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        raise _fail(str(msg)) from None


def _load(path: str) -> Checkpoint:
    try:
        return load(path)
    except (CheckpointError, FileNotFoundError) as err:
        raise _fail(str(err)) from None


def _load_pair(path_a: str, path_b: str) -> tuple[Checkpoint, Checkpoint]:
    a, b = _load(path_a), _load(path_b)
    try:
        check_compatible(a.params, b.params)
    except IncompatibleModelsError as err:
        raise _fail(f"{path_a} and {path_b} are different architectures: {err}") from None
    if a.config != b.config:
        raise _fail(f"{path_a} and {path_b} are different architectures: {a.config} vs {b.config}")
    return a, b


def _data(spec: str | None, seed: int = 0) -> Dataset:
    if spec is None:
        raise _fail("this command needs --data")
    return _run(load_data, spec, seed=seed)


def _settings(**kwargs: Any) -> EvalSettings:
    return _run(EvalSettings, **kwargs)


def _threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


data_option = click.option("--data", "data_spec", metavar="SPEC", help=DATA_SPEC_HELP)
threads_option = click.option(
    "--threads", type=int, default=None, help="CPU threads for PyTorch (default: PyTorch's choice)."
)
quiet_option = click.option("--quiet", is_flag=True, help="No progress bars.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lmckit")
def main() -> None:
    """Align, merge and measure linear mode connectivity between neural networks."""


# --------------------------------------------------------------------------- demo


@main.command()
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    help="Write the three path results as JSON here.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default="lmckit-demo.png",
    show_default=True,
    help="Write the plot here.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of model A (model B uses seed + 1).",
)
@threads_option
@quiet_option
def demo(
    json_path: str | None, plot_path: str, seed: int, threads: int | None, quiet: bool
) -> None:
    """Train two MLPs on scikit-learn digits and compare barriers by alignment method."""
    from lmckit.experiments.demo import run_demo
    from lmckit.plot import plot_paths

    _threads(threads)
    results = run_demo(seed=seed, progress=not quiet, log=click.echo)
    click.echo(format_table(results))
    if json_path:
        write_json(json_path, {k: v.to_dict() for k, v in results.items()})
        click.echo(f"wrote {json_path}")
    plot_paths(results, plot_path, title="Two MLPs on digits: linear paths")
    click.echo(f"wrote {plot_path}")


# --------------------------------------------------------------------------- train


def model_kwargs(
    model: str,
    data: Dataset,
    *,
    width: int,
    depth: int,
    width_mult: float,
    norm: str,
    activation: str,
) -> dict[str, Any]:
    """Constructor arguments of a zoo model sized for ``data``."""
    shape = data.input_shape
    if model == "mlp":
        return {
            "in_features": math.prod(shape),
            "hidden": [width] * depth,
            "out_features": data.num_classes,
            "activation": activation,
            "norm": "none" if norm == "auto" else norm,
        }
    if len(shape) != 3:
        raise _fail(
            f"{model} needs image data (channels, height, width); "
            f"{data.name} has inputs of shape {shape}"
        )
    norm = "batch" if norm == "auto" else norm
    if model == "vgg":
        return {
            "in_channels": shape[0],
            "num_classes": data.num_classes,
            "image_size": shape[1],
            "width_mult": width_mult,
            "norm": norm,
        }
    if width_mult != int(width_mult):
        raise _fail("resnet20 takes an integer --width-mult")
    return {
        "in_channels": shape[0],
        "num_classes": data.num_classes,
        "width_mult": int(width_mult),
        "norm": norm,
    }


@main.command("train")
@click.option("--model", type=click.Choice(MODEL_CHOICES), required=True, help="Architecture.")
@data_option
@click.option("--epochs", type=int, default=10, show_default=True)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Initialisation and data-order seed."
)
@click.option(
    "--out", type=click.Path(file_okay=False), required=True, help="Checkpoint directory to write."
)
@click.option("--width", type=int, default=512, show_default=True, help="MLP hidden width.")
@click.option(
    "--depth", type=int, default=3, show_default=True, help="MLP number of hidden layers."
)
@click.option(
    "--width-mult",
    type=float,
    default=1.0,
    show_default=True,
    help="Channel multiplier (VGG, ResNet20).",
)
@click.option(
    "--norm",
    type=click.Choice(NORMS),
    default="auto",
    show_default=True,
    help="Normalisation; auto = none for MLPs, batch for CNNs.",
)
@click.option(
    "--activation",
    type=click.Choice(["relu", "gelu"]),
    default="relu",
    show_default=True,
    help="MLP activation.",
)
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adam", show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Peak learning rate.")
@click.option("--weight-decay", type=float, default=0.0, show_default=True)
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option(
    "--schedule", type=click.Choice(["cosine", "constant"]), default="cosine", show_default=True
)
@threads_option
@quiet_option
def train_cmd(
    model: str,
    data_spec: str | None,
    epochs: int,
    seed: int,
    out: str,
    width: int,
    depth: int,
    width_mult: float,
    norm: str,
    activation: str,
    optimizer: str,
    lr: float,
    weight_decay: float,
    batch_size: int,
    schedule: str,
    threads: int | None,
    quiet: bool,
) -> None:
    """Train a zoo model and write a checkpoint directory."""
    _threads(threads)
    data = _data(data_spec, seed=0)
    kwargs = model_kwargs(
        model,
        data,
        width=width,
        depth=depth,
        width_mult=width_mult,
        norm=norm,
        activation=activation,
    )
    config = _run(
        TrainConfig,
        epochs=epochs,
        batch_size=batch_size,
        optimizer=optimizer,
        lr=lr,
        weight_decay=weight_decay,
        schedule=schedule,
    )
    module, params = _run(create_model, model, seed=seed, **kwargs)
    trained = _run(train, module, params, data, config, seed=seed, progress=not quiet)
    from lmckit.data import batches
    from lmckit.evaluate import evaluate

    test = evaluate(module, trained, batches(data.x_test, data.y_test, 500))
    save(
        out,
        module,
        trained,
        metadata={
            "data": data_spec,
            "seed": seed,
            "train": config.__dict__,
            "test_loss": test.loss,
            "test_acc": test.acc,
        },
    )
    click.echo(f"test loss {test.loss:.4f}, accuracy {100 * test.acc:.2f}%")
    click.echo(f"wrote {out}")


# --------------------------------------------------------------------------- align


@main.command("align")
@click.argument("model_a", type=click.Path(exists=True))
@click.argument("model_b", type=click.Path(exists=True))
@click.option(
    "--method", type=click.Choice(["weight", "activation"]), default="weight", show_default=True
)
@data_option
@click.option(
    "--out", type=click.Path(file_okay=False), required=True, help="Directory for B aligned to A."
)
@click.option("--seed", type=int, default=0, show_default=True)
@threads_option
@quiet_option
def align_cmd(
    model_a: str,
    model_b: str,
    method: str,
    data_spec: str | None,
    out: str,
    seed: int,
    threads: int | None,
    quiet: bool,
) -> None:
    """Align MODEL_B to MODEL_A under the architecture's symmetries; write the result."""
    _threads(threads)
    a, b = _load_pair(model_a, model_b)
    data = _data(data_spec) if method == "activation" else None
    spec = a.model.symmetry_spec()
    full = {"weight": "weight_matching", "activation": "activation_matching"}[method]
    result = _run(
        align_pair, full, a.model, spec, a.params, b.params, data, seed=seed, progress=not quiet
    )
    aligned = apply(spec, b.params, result.transform)
    save(
        out,
        b.config,
        aligned,
        metadata={
            "aligned_to": str(model_a),
            "source": str(model_b),
            "method": full,
            "seed": seed,
            "data": data_spec,
            "spaces": {k: vars(v) for k, v in result.spaces.items()},
        },
    )
    click.echo(result.summary())
    click.echo(f"wrote {out}")


# --------------------------------------------------------------------------- barrier


@main.command("barrier")
@click.argument("model_a", type=click.Path(exists=True))
@click.argument("model_b", type=click.Path(exists=True))
@data_option
@click.option(
    "--points",
    type=int,
    default=11,
    show_default=True,
    help="Points on the path, both ends included.",
)
@click.option("--split", type=click.Choice(["test", "train"]), default="test", show_default=True)
@click.option(
    "--fix",
    type=click.Choice(["auto", "none", "reset_bn", "repair"]),
    default="auto",
    show_default=True,
    help="Fix at each point: auto resets BatchNorm statistics where there are any.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False))
@threads_option
@quiet_option
def barrier_cmd(
    model_a: str,
    model_b: str,
    data_spec: str | None,
    points: int,
    split: str,
    fix: str,
    json_path: str | None,
    plot_path: str | None,
    threads: int | None,
    quiet: bool,
) -> None:
    """Loss and accuracy along the linear path from MODEL_A to MODEL_B."""
    _threads(threads)
    a, b = _load_pair(model_a, model_b)
    data = _data(data_spec)
    settings = _settings(split=split, points=points, fix=fix)
    result = _run(
        measure_path,
        a.model,
        a.params,
        b.params,
        data,
        settings,
        meta={"a": model_a, "b": model_b, "data": data_spec},
        progress=not quiet,
    )
    click.echo(format_table({"linear": result}))
    if json_path:
        payload = {k: v for k, v in result.to_dict().items()}
        write_json(json_path, payload)
        click.echo(f"wrote {json_path}")
    if plot_path:
        from lmckit.plot import plot_paths

        plot_paths({"linear": result}, plot_path)
        click.echo(f"wrote {plot_path}")


# --------------------------------------------------------------------------- merge


@main.command("merge")
@click.argument("model_a", type=click.Path(exists=True))
@click.argument("model_b", type=click.Path(exists=True))
@click.option(
    "--t", "t", type=float, default=0.5, show_default=True, help="Weight of B: (1 - t) A + t B."
)
@click.option("--reset-bn", is_flag=True, help="Recompute BatchNorm statistics on --data.")
@click.option(
    "--repair",
    "do_repair",
    is_flag=True,
    help="REPAIR: match channel statistics to the interpolated endpoints'.",
)
@data_option
@click.option("--out", type=click.Path(file_okay=False), required=True)
@threads_option
def merge_cmd(
    model_a: str,
    model_b: str,
    t: float,
    reset_bn: bool,
    do_repair: bool,
    data_spec: str | None,
    out: str,
    threads: int | None,
) -> None:
    """Interpolate MODEL_A and MODEL_B (align B first with `lmckit align`)."""
    _threads(threads)
    if reset_bn and do_repair:
        raise _fail("choose one of --reset-bn and --repair (REPAIR resets BatchNorm itself)")
    if not 0.0 <= t <= 1.0:
        raise _fail(f"--t must lie in [0, 1], got {t}")
    a, b = _load_pair(model_a, model_b)
    data = _data(data_spec) if (reset_bn or do_repair or data_spec) else None
    if data is not None:
        inputs = train_inputs(data, EvalSettings())
    if do_repair:
        merged = _run(repair, a.model, a.params, b.params, t, inputs)
    else:
        merged = interpolate(a.params, b.params, t)
        if reset_bn:
            if not has_batchnorm(a.model):
                raise _fail("--reset-bn: the model has no BatchNorm layers")
            merged = reset_batchnorm(a.model, merged, inputs())
    meta: dict[str, Any] = {
        "a": model_a,
        "b": model_b,
        "t": t,
        "reset_bn": reset_bn,
        "repair": do_repair,
        "data": data_spec,
    }
    if data is not None:
        from lmckit.data import batches
        from lmckit.evaluate import evaluate

        m = evaluate(a.model, merged, batches(data.x_test, data.y_test, 500))
        meta.update(test_loss=m.loss, test_acc=m.acc)
        click.echo(f"merged model: test loss {m.loss:.4f}, accuracy {100 * m.acc:.2f}%")
    save(out, a.config, merged, metadata=meta)
    click.echo(f"wrote {out}")


# --------------------------------------------------------------------------- reproduce


@main.command("reproduce")
@click.argument("name", required=False)
@click.option("--quick", is_flag=True, help="CPU-minute version (small models, few steps).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Output folder (default: runs/NAME).",
)
@click.option(
    "--data-root",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder with mnist/, tinyshakespeare/, gpt2_tokenizer/ "
    "(default: $LMCKIT_DATA_ROOT or ../shared/data).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--list", "list_only", is_flag=True, help="List the experiments and exit.")
@threads_option
@quiet_option
def reproduce_cmd(
    name: str | None,
    quick: bool,
    out_dir: str | None,
    data_root: str | None,
    seed: int,
    list_only: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Run a paper result by NAME: print its table, write figures and results.json."""
    from lmckit.experiments import ExperimentContext, list_experiments, run_experiment
    from lmckit.experiments.registry import default_data_root

    if list_only or name is None:
        for exp, doc in list_experiments().items():
            click.echo(f"{exp:<20} {doc}")
        return
    _threads(threads)
    ctx = ExperimentContext(
        out_dir=Path(out_dir or Path("runs") / name),
        data_root=Path(data_root) if data_root else default_data_root(),
        quick=quick,
        seed=seed,
        progress=not quiet,
        log=click.echo,
    )
    result = _run(run_experiment, name, ctx)
    click.echo(result.table)
    if result.notes:
        click.echo(result.notes)
    for fig in result.figures:
        click.echo(f"wrote {fig}")
    click.echo(f"wrote {ctx.out_dir / 'results.json'}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
