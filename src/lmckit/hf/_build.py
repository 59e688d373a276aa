"""A ``transformers`` module from a config dict and a state dict, with no per-family code.

The class comes from the config's ``architectures[0]`` (a ``transformers`` class), else
from ``AutoModel``'s mapping for the ``model_type``; a config whose ``auto_map`` sends
its model to custom code (``trust_remote_code``) is refused: that code is never run, and
the stock class would compute something else. Weights are handed to
``from_pretrained(None, config=..., state_dict=...)``: ``transformers`` builds the
module on the meta device and assigns the given tensors (no second copy when the dtype
already matches), applies its own renamings of on-disk names (e.g. ViT's
``encoder.layer`` -> ``layers`` in ``transformers`` 5) and ties weights. Nothing is
downloaded: there is no repository name to resolve.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.hf._files import HFError

__all__ = [
    "build_module",
    "import_transformers",
    "make_config",
    "model_class",
    "keep_dtypes",
    "quiet",
    "refuse_remote_code",
    "tied_keys",
]


def import_transformers() -> ModuleType:
    """The ``transformers`` package (version 5 or later), or an error saying how to get it."""
    try:
        import transformers
    except ImportError:
        raise HFError(
            "Hugging Face folders need the transformers package: pip install 'lmckit[hf]'"
        ) from None
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise HFError(
            f"Hugging Face folders need transformers >= 5 (installed: {transformers.__version__})"
        )
    return transformers


@contextmanager
def quiet(transformers: ModuleType) -> Iterator[None]:
    """Silence ``transformers``' progress bars and log messages; lmckit reports problems itself."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _one_line(err: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (transformers' validators span several)."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    text = text or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_config(raw: Mapping[str, Any], where: str | os.PathLike[str]) -> Any:
    """The ``transformers`` config object of a ``config.json`` dict.

    Raises:
        HFError: an unknown ``model_type`` or values its config class rejects.
    """
    transformers = import_transformers()
    model_type = raw.get("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise HFError(
            f"{where}: unknown model_type {model_type!r} (not in transformers "
            f"{transformers.__version__}; custom model code is never run)"
        )
    config_class = transformers.CONFIG_MAPPING[model_type]
    try:
        with quiet(transformers):
            return config_class.from_dict(dict(raw))
    except Exception as err:  # config classes validate with many exception types
        raise HFError(f"{where}: invalid {model_type} config: {_one_line(err)}") from None


def refuse_remote_code(raw: Mapping[str, Any], where: str | os.PathLike[str]) -> None:
    """Refuse a config whose ``auto_map`` sends its model or config classes to custom code
    (``trust_remote_code=True`` in ``transformers``): its users run that code, and the
    stock class its ``architectures`` names would compute something else, silently. An
    ``auto_map`` of tokenizers or processors alone is fine (lmckit reads no text with them).

    Raises:
        HFError: naming the custom classes.
    """
    auto = raw.get("auto_map")
    if auto is None:
        return
    if not isinstance(auto, dict):
        raise HFError(f"{where}: 'auto_map' must be an object, got {type(auto).__name__}")
    custom = sorted(k for k in auto if str(k).startswith(("AutoModel", "AutoConfig")))
    if custom:
        target = auto[custom[0]]
        code = target[0] if isinstance(target, list) and target else target
        raise HFError(
            f"{where}: auto_map sends {', '.join(custom)} to custom code ({code}), which "
            "transformers runs with trust_remote_code=True; lmckit never runs remote code "
            "and its stock class would compute something else"
        )


def model_class(raw: Mapping[str, Any], config: Any, where: str | os.PathLike[str]) -> type:
    """The ``transformers`` class that ``raw`` (a ``config.json`` dict) describes.

    ``architectures[0]`` when given, else the bare model ``AutoModel`` builds for the
    config. The class must be a ``PreTrainedModel`` of ``transformers`` taking this config.

    Raises:
        HFError: an unknown class, or one that does not take this config.
    """
    refuse_remote_code(raw, where)
    transformers = import_transformers()
    archs = raw.get("architectures")
    if archs is None or archs == []:
        try:
            return transformers.MODEL_MAPPING[type(config)]
        except KeyError:
            raise HFError(
                f"{where}: no 'architectures' in the config and no AutoModel class for "
                f"model_type {raw.get('model_type')!r}"
            ) from None
    if not isinstance(archs, list) or not isinstance(archs[0], str):
        raise HFError(f"{where}: 'architectures' must be a list of class names")
    name = archs[0]
    cls = getattr(transformers, name, None) if name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise HFError(
            f"{where}: unknown architecture {name!r}: transformers {transformers.__version__} "
            "has no such model class (custom model code is never run)"
        )
    expected = getattr(cls, "config_class", None)
    if isinstance(expected, type) and not isinstance(config, expected):
        raise HFError(
            f"{where}: architecture {name} takes a {expected.__name__}, but model_type "
            f"{raw.get('model_type')!r} gives a {type(config).__name__}"
        )
    return cls


def _names(keys: Any) -> str:
    shown = sorted(str(k) for k in keys)
    return ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")


def build_module(
    cls: type[Any],
    config: Any,
    state: Mapping[str, Tensor],
    *,
    dtype: torch.dtype | None,
    where: str | os.PathLike[str],
) -> nn.Module:
    """``cls`` built from ``config`` holding exactly the weights ``state``, in eval mode.

    Args:
        cls: a ``transformers`` ``PreTrainedModel`` class.
        config: its config object (see :func:`make_config`).
        state: weights under on-disk or in-memory names.
        dtype: floating dtype of the module; ``None``: the config's or the weights' own.
        where: the folder named in errors.

    Raises:
        HFError: weights missing, unexpected or of the wrong shape for this config
            (tied weights that are absent are fine), or a config ``transformers`` rejects.
    """
    transformers = import_transformers()
    name = cls.__name__
    # The global RNG stays as it was: transformers initialises (then overwrites) weights.
    with quiet(transformers), torch.random.fork_rng(devices=[]):
        try:
            module, info = cls.from_pretrained(
                None,
                config=config,
                state_dict=dict(state),
                dtype="auto" if dtype is None else dtype,
                output_loading_info=True,
                # mismatches are reported below, one line, instead of a bare RuntimeError
                ignore_mismatched_sizes=True,
            )
        except Exception as err:  # whatever the model's __init__ raises on this config
            raise HFError(f"{where}: transformers cannot build {name}: {_one_line(err)}") from None
    if info["mismatched_keys"]:
        key, got, expected = sorted(info["mismatched_keys"], key=lambda m: str(m[0]))[0]
        raise HFError(
            f"{where}: weight {key} has shape {tuple(got)}, but a {name} of this config "
            f"expects {tuple(expected)}"
        )
    missing, unexpected = info["missing_keys"], info["unexpected_keys"]
    if missing or unexpected:
        parts = [f"missing {_names(missing)}"] if missing else []
        parts += [f"unexpected {_names(unexpected)}"] if unexpected else []
        raise HFError(f"{where}: weights do not fit a {name} of this config: {'; '.join(parts)}")
    if info.get("error_msgs"):
        raise HFError(f"{where}: cannot load {name}: {info['error_msgs'][0]}")
    return module.eval()


def tied_keys(cls: type, config: Any) -> dict[str, str]:
    """``{target: source}`` of the weights a ``cls`` of ``config`` ties (meta device: no memory)."""
    transformers = import_transformers()
    try:
        with quiet(transformers), torch.random.fork_rng(devices=[]), torch.device("meta"):
            module = cls(config)
    except Exception as err:  # whatever the model's __init__ raises on this config
        raise HFError(f"cannot build {cls.__name__}: {_one_line(err)}") from None
    return dict(module.all_tied_weights_keys)


def keep_dtypes(module: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Give each of ``module``'s floating tensors the dtype it has in ``state`` (same
    names): ``transformers`` builds a module in one dtype, but a folder may store
    float32 norms beside bfloat16 weights, and each is kept as stored."""
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            given = state.get(name)
            if given is not None and given.is_floating_point() and given.dtype != tensor.dtype:
                tensor.data = given.to(tensor.device)
