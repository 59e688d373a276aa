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
from lmckit.data.spec import data_spec_paths
from lmckit.merge import has_batchnorm, repair, reset_batchnorm
from lmckit.models import create_model
from lmckit.outputs import OutputError, OutputKind, check_output_dir, check_output_file
from lmckit.params import IncompatibleModelsError, check_compatible, interpolate
from lmckit.symmetry import HeadPermutation, Orthogonal, Permutation, SymmetrySpec, apply
from lmckit.train import OPTIMIZERS, TrainConfig, fit

MODEL_CHOICES = ("mlp", "vgg", "resnet20", "gpt2", "vit")
NORMS = ("auto", "none", "batch", "layer", "group", "rms")
TRANSFORMERS = ("gpt2", "vit")
#: Logit floats per evaluation batch of a language model (batch * time * vocab), ~256 MB.
LM_EVAL_LOGITS = 2**26


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


def _inputs(*paths: str | None, data_spec: str | None = None) -> list[str]:
    """Every path a command reads: checkpoints and the files of its data spec."""
    out = [p for p in paths if p]
    if data_spec:
        out += data_spec_paths(data_spec)
    return out


def _out_dir(out: str, kind: OutputKind, inputs: list[str], force: bool) -> None:
    """Refuse an output folder that would destroy an input or a user's folder (before work)."""
    try:
        check_output_dir(out, kind=kind, inputs=inputs, force=force)
    except OutputError as err:
        raise _fail(str(err)) from None


def _out_file(path: str | None, inputs: list[str], *, plot: bool = False) -> None:
    """Refuse a --json/--plot target inside an input or of an unknown image type."""
    if path is None:
        return
    suffixes = None
    if plot:
        from lmckit.plot import PLOT_SUFFIXES

        suffixes = PLOT_SUFFIXES
    try:
        check_output_file(path, inputs=inputs, suffixes=suffixes)
    except OutputError as err:
        raise _fail(str(err)) from None


def _threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


data_option = click.option("--data", "data_spec", metavar="SPEC", help=DATA_SPEC_HELP)
threads_option = click.option(
    "--threads", type=int, default=None, help="CPU threads for PyTorch (default: PyTorch's choice)."
)
quiet_option = click.option("--quiet", is_flag=True, help="No progress bars.")
force_option = click.option(
    "--force",
    is_flag=True,
    help="Replace an existing non-empty --out folder that lmckit did not write "
    "(never an input, never the working directory).",
)


class _Group(click.Group):
    """Reports failures to write outputs (disk full, permissions) as clean errors."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CheckpointError as err:
            raise _fail(str(err)) from None
        except OSError as err:
            raise _fail(f"could not write output: {err}") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
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

    _out_file(json_path, [])
    _out_file(plot_path, [], plot=True)
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
    n_layer: int = 6,
    n_head: int = 4,
    n_embd: int = 256,
    n_inner: int | None = None,
    context: int | None = None,
    patch_size: int = 4,
    dropout: float = 0.0,
    tie_embeddings: bool = True,
) -> dict[str, Any]:
    """Constructor arguments of a zoo model sized for ``data``."""
    shape = data.input_shape
    if model in TRANSFORMERS:
        return _transformer_kwargs(
            model,
            data,
            norm=norm,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=n_embd,
            n_inner=n_inner,
            context=context,
            patch_size=patch_size,
            dropout=dropout,
            tie_embeddings=tie_embeddings,
        )
    if data.is_language:
        raise _fail(f"{model} needs feature or image data; {data.name} holds token ids")
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


def _transformer_kwargs(
    model: str,
    data: Dataset,
    *,
    norm: str,
    n_layer: int,
    n_head: int,
    n_embd: int,
    n_inner: int | None,
    context: int | None,
    patch_size: int,
    dropout: float,
    tie_embeddings: bool,
) -> dict[str, Any]:
    """GPT-2 (token data) or ViT (square images) arguments; the norm is layer or rms."""
    if norm not in ("auto", "layer", "rms"):
        raise _fail(f"{model} takes --norm layer or rms (auto = layer), got {norm}")
    norm = "layer" if norm == "auto" else norm
    shape = data.input_shape
    if model == "gpt2":
        if not data.is_language:
            raise _fail(f"gpt2 needs token data (e.g. shakespeare:...); {data.name} is not")
        block = shape[0]
        context = block if context is None else context
        if context < block:
            raise _fail(f"--context {context} is shorter than the data's blocks of {block}")
        return {
            "vocab_size": data.num_classes,
            "n_layer": n_layer,
            "n_head": n_head,
            "n_embd": n_embd,
            "n_inner": n_inner,
            "context": context,
            "norm": norm,
            "tie_embeddings": tie_embeddings,
            "dropout": dropout,
        }
    if len(shape) != 3 or shape[1] != shape[2] or data.is_language:
        raise _fail(f"vit needs square images (channels, size, size); {data.name} has {shape}")
    return {
        "image_size": shape[1],
        "patch_size": patch_size,
        "in_channels": shape[0],
        "num_classes": data.num_classes,
        "width": n_embd,
        "depth": n_layer,
        "heads": n_head,
        "mlp_dim": n_inner,
        "norm": norm,
    }


def _eval_batch_size(data: Dataset, requested: int | None) -> int:
    """Examples per evaluation batch: ``requested``, else 500 (a few for language models)."""
    if requested is not None:
        return requested
    if data.is_language:
        # logits are (batch, time, vocab): bound their size, not the batch's
        return max(1, LM_EVAL_LOGITS // (data.input_shape[0] * data.num_classes))
    return 500


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise _fail(f"bad --device {name!r}: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise _fail("--device cuda: no CUDA device is available")
    return device


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
    help="Normalisation; auto = none for MLPs, batch for CNNs, layer for transformers "
    "(rms: affine-free RMSNorm, transformers only).",
)
@click.option(
    "--activation",
    type=click.Choice(["relu", "gelu"]),
    default="relu",
    show_default=True,
    help="MLP activation.",
)
@click.option("--n-layer", type=int, default=6, show_default=True, help="Transformer layers.")
@click.option("--n-head", type=int, default=4, show_default=True, help="Attention heads per layer.")
@click.option(
    "--n-embd", type=int, default=256, show_default=True, help="Transformer residual width."
)
@click.option(
    "--n-inner", type=int, default=None, help="Transformer MLP width [default: 4 * n-embd]."
)
@click.option(
    "--context",
    type=int,
    default=None,
    help="GPT-2 maximum sequence length [default: the data's block length].",
)
@click.option("--patch-size", type=int, default=4, show_default=True, help="ViT patch size.")
@click.option(
    "--dropout", type=float, default=0.0, show_default=True, help="GPT-2 dropout probability."
)
@click.option(
    "--untie-embeddings", is_flag=True, help="GPT-2: a separate LM head instead of wte^T."
)
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adam", show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Peak learning rate.")
@click.option("--weight-decay", type=float, default=0.0, show_default=True)
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option(
    "--schedule", type=click.Choice(["cosine", "constant"]), default="cosine", show_default=True
)
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
    n_layer: int,
    n_head: int,
    n_embd: int,
    n_inner: int | None,
    context: int | None,
    patch_size: int,
    dropout: float,
    untie_embeddings: bool,
    optimizer: str,
    lr: float,
    weight_decay: float,
    batch_size: int,
    schedule: str,
    warmup: float,
    max_steps: int | None,
    grad_clip: float | None,
    patience: int | None,
    eval_every: int | None,
    eval_batch_size: int | None,
    device: str,
    threads: int | None,
    quiet: bool,
    force: bool,
) -> None:
    """Train a zoo model and write a checkpoint directory.

    Transformers: `--model gpt2` on token data (e.g. --data shakespeare:...), `--model vit`
    on square images; sizes from --n-layer, --n-head, --n-embd, --n-inner (--context,
    --patch-size). With --patience, training stops early on the validation loss.
    """
    _out_dir(out, "checkpoint", _inputs(data_spec=data_spec), force)
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
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        n_inner=n_inner,
        context=context,
        patch_size=patch_size,
        dropout=dropout,
        tie_embeddings=not untie_embeddings,
    )
    config = _run(
        TrainConfig,
        epochs=epochs,
        batch_size=batch_size,
        optimizer=optimizer,
        lr=lr,
        weight_decay=weight_decay,
        schedule=schedule,
        warmup=warmup,
        max_steps=max_steps,
        grad_clip=grad_clip,
        patience=patience,
        eval_every=eval_every,
        eval_batch_size=eval_batch_size,
    )
    torch_device = _device(device)
    module, params = _run(create_model, model, seed=seed, **kwargs)
    result = _run(
        fit, module, params, data, config, seed=seed, device=torch_device, progress=not quiet
    )
    trained = result.params
    from lmckit.data import batches
    from lmckit.evaluate import evaluate

    test = evaluate(
        module, trained, batches(data.x_test, data.y_test, _eval_batch_size(data, eval_batch_size))
    )
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
        stop = "stopped early" if result.stopped_early else "ran to the end"
        click.echo(
            f"best validation loss {result.best.loss:.4f} at step {result.best.step} "
            f"(epoch {result.best.epoch}); {stop} after {result.steps} steps"
        )
    save(out, module, trained, metadata=metadata)
    click.echo(f"test loss {test.loss:.4f}, accuracy {100 * test.acc:.2f}%")
    click.echo(f"wrote {out}")


# --------------------------------------------------------------------------- align

SYMMETRIES = ("permutation", "orthogonal")


def _with_symmetry(
    a: Checkpoint, b: Checkpoint, symmetry: str | None, *, circuits: bool = False
) -> tuple[Checkpoint, Checkpoint, SymmetrySpec, bool]:
    """The pair and spec under ``--symmetry`` (and ``--circuits``); ``True`` when the pair
    was rewritten."""
    a, b, spec, rewritten = _symmetry_pair(a, b, symmetry)
    if not circuits:
        return a, b, spec, rewritten
    ca, cb = (_circuit_form(c) for c in (a, b))
    full = ca.model.symmetry_spec()
    # keep the groups --symmetry chose (the permutations-only ablation); circuit heads
    # are plain permutations of whole circuits
    kept = {
        s.name: spec[s.name].group
        for s in full
        if s.name in spec.names and not isinstance(spec[s.name].group, HeadPermutation)
    }
    return ca, cb, full.with_groups(**kept), True


def _circuit_form(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` with its attention heads rewritten as QK/OV circuits (``--circuits``);
    a checkpoint already in circuit form is returned as is."""
    from lmckit.rewrites import heads_to_circuits

    if not hasattr(ckpt.model, "attention_modules"):
        raise _fail(f"--circuits: {ckpt.config.name} has no attention heads")
    if getattr(ckpt.model, "attention", None) == "circuits":
        return ckpt
    module, params = _run(heads_to_circuits, ckpt.model, ckpt.params)
    return Checkpoint(module, params, module.config)


def _symmetry_pair(
    a: Checkpoint, b: Checkpoint, symmetry: str | None
) -> tuple[Checkpoint, Checkpoint, SymmetrySpec, bool]:
    """The pair and spec under ``--symmetry``; ``True`` when the pair was rewritten.

    ``orthogonal`` keeps a spec's orthogonal spaces; a LayerNorm transformer (a spec
    with a ``residual`` space and ``norm="layer"``) is first rewritten to its RMSNorm
    form, whose residual stream is orthogonal. ``permutation`` turns orthogonal spaces
    into permutation spaces (the permutations-only ablation).
    """
    spec = a.model.symmetry_spec()
    if symmetry is None:
        return a, b, spec, False
    if symmetry == "permutation":
        ortho = {s.name: Permutation() for s in spec if isinstance(s.group, Orthogonal)}
        return a, b, spec.with_groups(**ortho), False
    if any(isinstance(s.group, Orthogonal) for s in spec):
        return a, b, spec, False
    if "residual" in spec.names and getattr(a.model, "norm", None) == "layer":
        from lmckit.rewrites import layernorm_to_rmsnorm

        rewritten = []
        for ckpt in (a, b):
            module, params = _run(layernorm_to_rmsnorm, ckpt.model, ckpt.params)
            rewritten.append(Checkpoint(module, params, module.config))
        ra, rb = rewritten
        return ra, rb, ra.model.symmetry_spec(), True
    raise _fail(
        f"--symmetry orthogonal: {a.config.name} has no orthogonal-capable residual stream "
        f"(its spaces {', '.join(spec.names)} allow permutations only)"
    )


@main.command("align")
@click.argument("model_a", type=click.Path(exists=True))
@click.argument("model_b", type=click.Path(exists=True))
@click.option(
    "--method",
    type=click.Choice(["weight", "activation", "learned"]),
    default="weight",
    show_default=True,
    help="learned: straight-through learned matching from weight matching (needs --data).",
)
@click.option(
    "--symmetry",
    type=click.Choice(SYMMETRIES),
    default=None,
    help="permutation: orthogonal spaces become permutations; orthogonal: residual stream "
    "by an orthogonal map (LayerNorm transformers are rewritten to RMSNorm first). "
    "Default: the architecture's own groups.",
)
@click.option(
    "--steps", type=int, default=500, show_default=True, help="Learned matching: max steps."
)
@click.option(
    "--lr", type=float, default=0.01, show_default=True, help="Learned matching: AdamW rate."
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Learned matching: torch device for its forward and backward passes, e.g. cuda.",
)
@click.option(
    "--head-bases",
    is_flag=True,
    help="Transformers: after the transform, align each matched head's query/key and "
    "value/output bases by orthogonal maps (data-free; the function is unchanged).",
)
@click.option(
    "--circuits",
    is_flag=True,
    help="Transformers: rewrite both models' heads as QK/OV circuits first (exact) and "
    "align in that form, the form in which heads have no inner bases; writes both.",
)
@data_option
@click.option(
    "--out", type=click.Path(file_okay=False), required=True, help="Directory for B aligned to A."
)
@click.option("--seed", type=int, default=0, show_default=True)
@force_option
@threads_option
@quiet_option
def align_cmd(
    model_a: str,
    model_b: str,
    method: str,
    symmetry: str | None,
    steps: int,
    lr: float,
    device: str,
    head_bases: bool,
    circuits: bool,
    data_spec: str | None,
    out: str,
    seed: int,
    force: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Align MODEL_B to MODEL_A under the architecture's symmetries; write the result."""
    from lmckit.align import LearnedMatchingConfig, align_head_bases, learned_matching

    uses_data = method in ("activation", "learned")
    _out_dir(
        out,
        "checkpoint",
        _inputs(model_a, model_b, data_spec=data_spec if uses_data else None),
        force,
    )
    _threads(threads)
    if circuits and head_bases:
        raise _fail("--head-bases aligns bases inside heads; --circuits leaves none")
    torch_device = _device(device)
    a, b = _load_pair(model_a, model_b)
    a, b, spec, rewritten = _with_symmetry(a, b, symmetry, circuits=circuits)
    data = _data(data_spec) if method in ("activation", "learned") else None
    full = {
        "weight": "weight_matching",
        "activation": "activation_matching",
        "learned": "learned_matching",
    }[method]
    if method == "learned":
        config = _run(LearnedMatchingConfig, steps=steps, lr=lr)
        result = _run(
            learned_matching,
            a.model,
            spec,
            a.params,
            b.params,
            data,
            config,
            seed=seed,
            progress=not quiet,
            device=torch_device,
        )
    else:
        result = _run(
            align_pair, full, a.model, spec, a.params, b.params, data, seed=seed, progress=not quiet
        )
    aligned = apply(spec, b.params, result.transform)
    if head_bases:
        aligned = _run(align_head_bases, spec, a.params, aligned)
    metadata: dict[str, Any] = {
        "aligned_to": str(model_a),
        "source": str(model_b),
        "method": full,
        "symmetry": symmetry,
        "seed": seed,
        "data": data_spec,
        "head_bases": head_bases,
        "circuits": circuits,
        "spaces": {k: vars(v) for k, v in result.spaces.items()},
    }
    if method == "learned":
        metadata["learned"] = {"steps": steps, "lr": lr, "validation_midpoint": result.history}
    if rewritten:
        # B is saved rewritten (RMSNorm form, circuits): A's same form is the reference
        reference = str(Path(out) / "reference")
        metadata["reference"] = reference
    save(out, b.config, aligned, metadata=metadata)
    if rewritten:
        save(reference, a.config, a.params, metadata={"rewritten_from": str(model_a)})
    click.echo(result.summary())
    click.echo(f"wrote {out}")
    if rewritten:
        form = " and ".join(
            f
            for f, on in (
                ("RMSNorm form", getattr(a.model, "norm", None) == "rms"),
                ("circuit form", circuits),
            )
            if on
        )
        click.echo(f"wrote {reference} (MODEL_A in {form}: measure barriers against it)")


# --------------------------------------------------------------------------- barrier


def _load_all(paths: tuple[str, ...]) -> list[Checkpoint]:
    first = _load(paths[0])
    loaded = [first]
    for path in paths[1:]:
        _, other = _load_pair(paths[0], path)
        loaded.append(other)
    return loaded


def _simplex(
    paths: tuple[str, ...],
    data: Dataset,
    data_spec: str | None,
    settings: EvalSettings,
    *,
    resolution: int,
    align: str,
    seed: int,
    head_bases: bool,
    circuits: bool,
    json_path: str | None,
    plot_path: str | None,
    quiet: bool,
) -> None:
    """The multi-model barrier over the simplex spanned by ``paths``."""
    from lmckit.align import align_head_bases, universe_matching
    from lmckit.data import batches
    from lmckit.paths import evaluate_simplex

    if settings.fix == "repair":
        raise _fail("--fix repair is for two models; use reset_bn or none with --simplex")
    ckpts = _load_all(paths)
    if circuits:
        ckpts = [_circuit_form(c) for c in ckpts]
    model = ckpts[0].model
    models = [c.params for c in ckpts]
    meta: dict[str, Any] = {"models": list(paths), "data": data_spec, "align": align}
    meta["circuits"] = circuits
    if align == "weight":
        spec = model.symmetry_spec()
        universe = _run(universe_matching, spec, models, seed=seed, progress=not quiet)
        models = universe.aligned(spec, models)
        meta.update(align_sweeps=universe.iterations, align_seconds=round(universe.seconds, 4))
        if head_bases:
            first = models[0]
            models = [first] + [_run(align_head_bases, spec, first, p) for p in models[1:]]
            meta["head_bases"] = True
    fix = settings.fix
    if fix == "auto":
        fix = "reset_bn" if has_batchnorm(model) else "none"
    prepare = None
    if fix == "reset_bn":
        if not has_batchnorm(model):
            raise _fail("--fix reset_bn needs a network with BatchNorm")
        inputs = train_inputs(data, settings)
        prepare = lambda theta, _w: reset_batchnorm(model, theta, inputs())  # noqa: E731
    x, y = data.split(settings.split)
    meta.update(split=settings.split, fix=fix, resolution=resolution)
    result = _run(
        evaluate_simplex,
        model,
        models,
        lambda: batches(x, y, settings.batch_size),
        resolution=resolution,
        prepare=prepare,
        meta=meta,
        progress=not quiet,
    )
    vertices = "/".join(f"{v:.4f}" for v in result.vertex_loss)
    click.echo(
        f"simplex of {result.k} models ({len(result.weights)} points, align {align}): "
        f"loss barrier {result.barrier_loss:.4f}, accuracy barrier "
        f"{100 * result.barrier_acc:.2f}%, centroid loss {result.centroid_loss:.4f}, "
        f"vertex losses {vertices}"
    )
    if json_path:
        write_json(json_path, result.to_dict())
        click.echo(f"wrote {json_path}")
    if plot_path:
        if result.k != 3:
            raise _fail(f"--plot draws the simplex of 3 models, got {result.k}")
        from lmckit.plot import plot_simplex

        labels = tuple(Path(p).name for p in paths)
        plot_simplex({f"align: {align}": result}, plot_path, labels=labels)
        click.echo(f"wrote {plot_path}")


@main.command("barrier")
@click.argument("models", nargs=-1, required=True, type=click.Path(exists=True))
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
@click.option(
    "--simplex",
    is_flag=True,
    help="Several models: loss over the simplex they span and the multi-model barrier.",
)
@click.option(
    "--resolution",
    type=int,
    default=10,
    show_default=True,
    help="With --simplex: grid step 1/R in each convex weight.",
)
@click.option(
    "--align",
    "align_method",
    type=click.Choice(["none", "weight"]),
    default="none",
    show_default=True,
    help="With --simplex: weight: universe matching of all models into one frame first.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="With --align weight.")
@click.option(
    "--head-bases",
    is_flag=True,
    help="With --align weight, transformers: also align every model's attention-head bases "
    "to the first model's.",
)
@click.option(
    "--circuits",
    is_flag=True,
    help="Transformers: interpolate (and align) the models with every head rewritten as its "
    "QK/OV circuit (exact at the ends; the path is the paper's).",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False))
@threads_option
@quiet_option
def barrier_cmd(
    models: tuple[str, ...],
    data_spec: str | None,
    points: int,
    split: str,
    fix: str,
    simplex: bool,
    resolution: int,
    align_method: str,
    seed: int,
    head_bases: bool,
    circuits: bool,
    json_path: str | None,
    plot_path: str | None,
    threads: int | None,
    quiet: bool,
) -> None:
    """Loss and accuracy along the linear path from MODEL_A to MODEL_B.

    With --simplex, MODELS are two or more checkpoints and the loss is measured over
    the simplex they span (multi-model barrier; --plot draws it for three).
    """
    _threads(threads)
    if not simplex and len(models) != 2:
        raise _fail(f"give two models (or --simplex for several), got {len(models)}")
    if not simplex and align_method != "none":
        raise _fail("--align is for --simplex; align a pair with `lmckit align` first")
    if simplex and len(models) < 2:
        raise _fail("--simplex needs at least two models")
    if head_bases and align_method != "weight":
        raise _fail("--head-bases goes with --simplex --align weight")
    if head_bases and circuits:
        raise _fail("--head-bases aligns bases inside heads; --circuits leaves none")
    inputs = _inputs(*models, data_spec=data_spec)
    _out_file(json_path, inputs)
    _out_file(plot_path, inputs, plot=True)
    data = _data(data_spec)
    settings = _settings(
        split=split, points=points, fix=fix, batch_size=_eval_batch_size(data, None)
    )
    if simplex:
        _simplex(
            models,
            data,
            data_spec,
            settings,
            resolution=resolution,
            align=align_method,
            seed=seed,
            head_bases=head_bases,
            circuits=circuits,
            json_path=json_path,
            plot_path=plot_path,
            quiet=quiet,
        )
        return
    model_a, model_b = models
    a, b = _load_pair(model_a, model_b)
    if circuits:
        a, b = _circuit_form(a), _circuit_form(b)
    result = _run(
        measure_path,
        a.model,
        a.params,
        b.params,
        data,
        settings,
        meta={"a": model_a, "b": model_b, "data": data_spec, "circuits": circuits},
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
@force_option
@threads_option
def merge_cmd(
    model_a: str,
    model_b: str,
    t: float,
    reset_bn: bool,
    do_repair: bool,
    data_spec: str | None,
    out: str,
    force: bool,
    threads: int | None,
) -> None:
    """Interpolate MODEL_A and MODEL_B (align B first with `lmckit align`)."""
    _out_dir(out, "checkpoint", _inputs(model_a, model_b, data_spec=data_spec), force)
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
@force_option
@threads_option
@quiet_option
def reproduce_cmd(
    name: str | None,
    quick: bool,
    out_dir: str | None,
    data_root: str | None,
    seed: int,
    list_only: bool,
    force: bool,
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
    root = Path(data_root) if data_root else default_data_root()
    target = Path(out_dir or Path("runs") / name)
    _out_dir(str(target), "experiment", [str(root)], force)
    _threads(threads)
    ctx = ExperimentContext(
        out_dir=target,
        data_root=root,
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
