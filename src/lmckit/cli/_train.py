"""``lmckit train``: a seeded zoo model trained on a dataset, written as a checkpoint."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from lmckit.cli._common import (
    check_out_dir,
    choice_option,
    count_option,
    data_option,
    force_option,
    input_paths,
    load_dataset,
    parse_device,
    quiet_option,
    seed_option,
    set_threads,
    threads_option,
)
from lmckit.formats._checkpoint import save
from lmckit.models._sizing import ARCHITECTURES, ModelOptions, sized_config
from lmckit.training._train import OPTIMIZERS, TrainConfig
from lmckit.workflow import train_model
from lmckit.workflow._train import TrainedModel

__all__ = ["command"]

NORMS = ("auto", "none", "batch", "layer", "group", "rms")


@click.command("train")
@click.option("--model", type=click.Choice(ARCHITECTURES), required=True, help="Architecture.")
@data_option
@count_option("--epochs", 10)
@seed_option("Initialisation and data-order seed.")
@click.option(
    "--out", type=click.Path(file_okay=False), required=True, help="Checkpoint directory to write."
)
@count_option("--width", 512, "MLP hidden width.")
@count_option("--depth", 3, "MLP number of hidden layers.")
@click.option(
    "--width-mult",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Channel multiplier (VGG, ResNet20).",
)
@choice_option(
    "--norm",
    NORMS,
    "auto",
    "Normalisation; auto = none for MLPs, batch for CNNs, layer for transformers "
    "(rms: affine-free RMSNorm, transformers only).",
)
@choice_option("--activation", ["relu", "gelu"], "relu", "MLP activation.")
@count_option("--n-layer", 6, "Transformer layers.")
@count_option("--n-head", 4, "Attention heads per layer.")
@count_option("--n-embd", 256, "Transformer residual width.")
@count_option("--n-inner", None, "Transformer MLP width [default: 4 * n-embd].")
@count_option(
    "--context", None, "GPT-2 maximum sequence length [default: the data's block length]."
)
@count_option("--patch-size", 4, "ViT patch size.")
@click.option(
    "--dropout",
    type=float,
    default=0.0,
    show_default=True,
    help="GPT-2 dropout probability (the other models have no dropout).",
)
@click.option(
    "--untie-embeddings", is_flag=True, help="GPT-2: a separate LM head instead of wte^T."
)
@choice_option("--optimizer", OPTIMIZERS, "adam")
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Peak learning rate.")
@click.option("--weight-decay", type=float, default=0.0, show_default=True)
@count_option("--batch-size", 128)
@choice_option("--schedule", ["cosine", "constant"], "cosine")
@click.option(
    "--warmup", type=float, default=0.0, show_default=True, help="Fraction of linear warm-up."
)
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@force_option
@click.option("--grad-clip", type=float, default=None, help="Clip the gradient norm.")
@click.option(
    "--patience",
    type=int,
    default=None,
    help="Early stopping: stop after this many validation checks without improvement and "
    "keep the best parameters (needs data with a validation split).",
)
@click.option(
    "--eval-every",
    type=int,
    default=None,
    help="Steps between validation checks [default: every epoch, when validating].",
)
@click.option(
    "--eval-batch-size",
    type=int,
    default=None,
    help="Examples per evaluation batch [default: batch size for validation; for the test "
    "loss 500, or fewer for language models].",
)
@click.option(
    "--device", default="cpu", show_default=True, help="Torch device to train on, e.g. cuda."
)
@threads_option
@quiet_option
def command(
    model: str,
    data_spec: str | None,
    seed: int,
    out: str,
    force: bool,
    device: str,
    threads: int | None,
    quiet: bool,
    **settings: Any,
) -> None:
    """Train a zoo model and write a checkpoint directory.

    Transformers: `--model gpt2` on token data (e.g. --data shakespeare:...), `--model vit`
    on square images; sizes from --n-layer, --n-head, --n-embd, --n-inner (--context,
    --patch-size). With --patience, training stops early on the validation loss.
    """
    check_out_dir(out, "checkpoint", input_paths(data_spec=data_spec), force)
    set_threads(threads)
    options = _model_options(settings)
    config = TrainConfig(**settings)
    torch_device = parse_device(device)
    data = load_dataset(data_spec, seed=0)
    model_config = sized_config(
        model,
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        tokens=data.is_language,
        options=options,
        data_name=data.name,
    )
    trained = train_model(
        model_config,
        data,
        config,
        seed=seed,
        device=torch_device,
        eval_batch_size=config.eval_batch_size,
        progress=not quiet,
    )
    result, test = trained.result, trained.test
    metadata = _metadata(trained, config, data_spec=data_spec, seed=seed)
    if result.best is not None:
        stop = "stopped early" if result.stopped_early else "ran to the end"
        click.echo(
            f"best validation loss {result.best.loss:.4f} at step {result.best.step} "
            f"(epoch {result.best.epoch}); {stop} after {result.steps} steps"
        )
    save(out, trained.module, result.params, metadata=metadata, overwrite=force)
    click.echo(f"test loss {test.loss:.4f}, accuracy {100 * test.acc:.2f}%")
    click.echo(f"wrote {out}")


def _model_options(settings: dict[str, Any]) -> ModelOptions:
    """The model's options, taken out of the command's ``settings`` (the rest configure
    training): every field of :class:`ModelOptions`; ``--untie-embeddings`` for the last."""
    names = {f.name for f in dataclasses.fields(ModelOptions)} - {"tie_embeddings"}
    sizes = {k: settings.pop(k) for k in names}
    return ModelOptions(**sizes, tie_embeddings=not settings.pop("untie_embeddings"))


def _metadata(
    trained: TrainedModel, config: TrainConfig, *, data_spec: str | None, seed: int
) -> dict[str, Any]:
    """What the checkpoint records of its training: data, seed, settings, results."""
    result, test = trained.result, trained.test
    metadata: dict[str, Any] = {
        "data": data_spec,
        "seed": seed,
        "train": config.__dict__,
        "steps": result.steps,
        "epochs_run": result.epochs,
        "test_loss": test.loss,
        "test_acc": test.acc,
    }
    if result.best is not None:
        metadata.update(
            best_step=result.best.step,
            best_epoch=result.best.epoch,
            val_loss=result.best.loss,
            val_acc=result.best.acc,
            stopped_early=result.stopped_early,
        )
    return metadata
