"""Loading a Hugging Face folder as the ``transformers`` module it describes; inputs to trace it.

:func:`load_hf` works for any model ``transformers`` builds from its config (GPT-2, BERT,
ViT, Llama, Mistral are tested) with no per-family code; the module computes what
``AutoModel*.from_pretrained`` of the folder computes, in eval mode and float32 by
default. The key-value cache is switched off (``use_cache=False``) so that the module's
output holds only tensors and ``torch.export`` can trace it; it changes no logits.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lmckit._arguments import check_float_dtype
from lmckit._errors import ParameterError
from lmckit.formats._loaded import LoadedModel
from lmckit.hf._build import build_module, keep_dtypes, make_config, model_class
from lmckit.hf._files import CONFIG_FILE, HFError, read_hf_config, read_hf_header, read_hf_weights
from lmckit.hf._layout import stored_layout
from lmckit.hf._validate import check_config_fits, layout_of
from lmckit.outputs import OutputKind
from lmckit.symmetry._params import first_nonfinite, module_params

__all__ = [
    "HFFormat",
    "config_differences",
    "example_inputs",
    "held_hf",
    "is_causal_lm",
    "load_hf",
]

#: ``config.json`` entries that do not change what a loaded model computes: bookkeeping,
#: label names, special token ids (the tokenizer's business), output switches, the
#: initialisation scale; dropout rates (entries naming ``dropout`` or ``pdrop``) are also
#: ignored, as lmckit evaluates in eval mode.
NON_FUNCTIONAL_CONFIG = frozenset(
    {
        "architectures",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "id2label",
        "label2id",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "initializer_range",
        "problem_type",
        "tokenizer_class",
        "finetuning_task",
        "task_specific_params",
    }
)


@dataclass(frozen=True)
class HFFormat:
    """The Hugging Face folder format (:class:`~lmckit.formats._loaded.ModelFormat`).

    A loaded folder is a :class:`~lmckit.formats.LoadedModel` whose ``module`` is the
    ``transformers`` model (eval mode, weights loaded, ``use_cache`` off) and whose
    ``params`` are ``module.state_dict()`` (in-memory names) with each tied weight once,
    under its first name (``transformer.wte.weight``, not ``lm_head.weight``), as
    ``named_parameters()`` and ``torch.export`` list it: ``functional_call(module,
    params, ...)`` then ties as the module does, and a transform of the embeddings
    reaches the tied head.

    Attributes:
        config: the folder's ``config.json`` as read (``use_cache`` as stored).
        class_name: the ``transformers`` class, e.g. ``"LlamaForCausalLM"``.
        source: the folder; ``None`` for a module held in memory (``config`` is then
            ``module.config.to_dict()``).
    """

    config: dict[str, Any]
    class_name: str
    source: Path | None
    name: ClassVar[str] = "hf"
    output_kind: ClassVar[OutputKind] = "hf"

    def differences(
        self, other: Any, modules: tuple[nn.Module, nn.Module], *, full: bool = True
    ) -> list[str]:
        """Config entries that change what the models compute (:func:`config_differences`),
        then each weight's stored dtype (an output is stored as B is, weight by weight: two
        storages would leave one unsaid). A recorded form never changes either."""
        found = config_differences(self, other, modules)
        if found:
            return found
        stored_a, stored_b = stored_layout(self.source), stored_layout(other.source)
        for key in sorted(stored_a.dtypes.keys() & stored_b.dtypes.keys()):
            da, db = stored_a.dtypes[key], stored_b.dtypes[key]
            if da != db:
                names = [str(d).removeprefix("torch.") for d in (da, db)]
                return [f"stored dtype: {names[0]} vs {names[1]}: {key}"]
        return []

    def save(
        self,
        path: str | os.PathLike[str],
        model: Any,
        params: Mapping[str, Tensor],
        *,
        metadata: Mapping[str, Any] | None,
        overwrite: bool,
        dtype: torch.dtype | None = None,
        sources: Sequence[str | os.PathLike[str]] = (),
        module: Any = None,
        config_changes: Mapping[str, Any] | None = None,
    ) -> Path:
        """:func:`lmckit.hf.save_hf` of ``params`` as a folder of ``model``'s class."""
        from lmckit.hf._files import is_hf_folder
        from lmckit.hf._save import save_hf

        if module is not None:
            raise ParameterError("{module}= is for lmckit checkpoints; a Hugging Face folder "
                                 "keeps its class", module="module")  # fmt: skip
        return save_hf(path, model, params, config_changes=config_changes, metadata=metadata,
                       overwrite=overwrite, dtype=dtype,
                       sources=[p for p in sources if is_hf_folder(p)])  # fmt: skip

    def describe(self, module: nn.Module) -> str:
        return f"a Hugging Face model ({type(module).__name__})"


def held_hf(module: nn.Module) -> LoadedModel:
    """A ``transformers`` model held in memory: its config is all a folder needs."""
    params = module_params(module)
    config: Any = module.config
    raw = config.to_dict()
    return LoadedModel(module, params, HFFormat(raw, type(module).__name__, None), None)


def _no_cache(config: Any) -> None:
    # A DynamicCache in the output is not a pytree torch.export knows; the logits do not
    # depend on it.
    for cfg in {id(c): c for c in (config, config.get_text_config())}.values():
        if getattr(cfg, "use_cache", None):
            cfg.use_cache = False


def load_hf(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = torch.float32,
    check_values: bool = True,
) -> LoadedModel:
    """Read a local Hugging Face folder (``config.json``, weights) as a ``transformers``
    module (the Hugging Face format's reader: :func:`lmckit.load` reads every format).

    The class is ``architectures[0]`` of ``config.json`` (else ``AutoModel``'s), built
    from the local config alone (nothing is downloaded, custom code never runs); the
    config and class are checked before any weight is read, and the config against the
    weights' safetensors header (on the meta device) and the free memory before any
    module is allocated (:mod:`lmckit.hf._validate`). A weight that overflows ``dtype``
    (a float64 value beyond float32's range) is refused by name.

    Args:
        path: the folder (see :mod:`lmckit.hf._files` for the weight files accepted).
        dtype: floating dtype of the module; ``None`` keeps the folder's own.
        check_values: refuse NaN and infinite values (and overflows of ``dtype``) on
            loading, which reads every value. ``False`` with ``dtype=None`` reads no value
            (of weights stored in the config's dtype, which ``transformers`` does not
            convert): the safetensors files stay memory-mapped until a weight is used (for
            callers that check what they read, as weight matching does).

    Raises:
        HFError: naming the file and the first problem (a missing or corrupt weights
            file, an unknown architecture, weights that do not fit the config, a config
            too large for the memory, a weight that overflows ``dtype``, ...).
        ValueError: a ``dtype`` that is not floating point.
    """
    check_float_dtype(dtype)
    root = Path(path)
    raw = read_hf_config(root)
    where = root / CONFIG_FILE
    config = make_config(raw, where)
    cls = model_class(raw, config, where)
    _no_cache(config)
    header = read_hf_header(root)
    # a pickle has no header: read whole first
    weights = None if header is not None else read_hf_weights(root, check_values=check_values)
    layout = header if header is not None else layout_of(weights or {})
    check_config_fits(cls, config, raw, layout, dtype=dtype, where=root)
    if weights is None:
        weights = read_hf_weights(root, check_values=check_values)
    module = build_module(cls, config, weights, dtype=dtype, where=root)
    if dtype is None:  # each weight as stored (float32 norms beside bfloat16 weights)
        keep_dtypes(module, weights)
    params = module_params(module)
    # the stored values are finite (checked on reading): only the conversion can overflow
    # (with dtype=None too: transformers converts to the config's dtype)
    overflow = first_nonfinite(params) if check_values else None
    if overflow is not None:
        raise HFError(
            f"{root}: weight {overflow!r} overflows {params[overflow].dtype} (its stored values "
            "lie beyond that dtype's range); load it with dtype=torch.float64"
        )
    return LoadedModel(module, params, HFFormat(raw, cls.__name__, root), root)


def _functional(config: Any) -> dict[str, Any]:
    return {
        key: value
        for key, value in config.to_dict().items()
        if key not in NON_FUNCTIONAL_CONFIG
        and not key.startswith("_")
        and "dropout" not in key
        and "pdrop" not in key
    }


def config_differences(a: HFFormat, b: HFFormat, modules: tuple[nn.Module, nn.Module]) -> list[str]:
    """The config entries (with defaults filled in, from the ``modules`` built from them)
    on which two folders compute differently, as ``"key: A's value vs B's value"``;
    empty when they are one architecture.

    Entries in :data:`NON_FUNCTIONAL_CONFIG` (and dropout rates) are not compared; the
    class is (``class: ...``).
    """
    out = [f"class: {a.class_name} vs {b.class_name}"] if a.class_name != b.class_name else []
    ca, cb = (_functional(m.config) for m in modules)
    for key in sorted(ca.keys() | cb.keys()):
        if ca.get(key) != cb.get(key):
            out.append(f"{key}: {ca.get(key)!r} vs {cb.get(key)!r}")
    return out


def is_causal_lm(module: nn.Module) -> bool:
    """Whether a ``transformers`` module predicts each next token from the ones before it:
    its class is one of ``AutoModelForCausalLM``'s (a masked LM such as
    ``BertForMaskedLM``, or a bare encoder, is not)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return type(module).__name__ in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def as_pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def _with_decoder_inputs(
    module: nn.Module, main: Tensor, ids: Tensor | None = None
) -> tuple[Tensor | None, ...]:
    """``(main, None, ..., decoder_input_ids)`` positionally: an encoder-decoder model
    reads tokens on its decoder side, ``ids`` shifted right (T5, BART: the encoder's own
    tokens; a speech model: tokens of their own)."""
    names = list(inspect.signature(module.forward).parameters)
    if "decoder_input_ids" not in names:
        return (main,)
    tokens = main if ids is None else ids
    start = getattr(module.config, "decoder_start_token_id", None)
    decoder = tokens.roll(1, dims=1)
    decoder[:, 0] = int(start) if isinstance(start, int) else 0
    inputs: list[Tensor | None] = [main] + [None] * (names.index("decoder_input_ids") - 1)
    return (*inputs, decoder)


def _token_ids(config: Any, batch: int, length: int, gen: torch.Generator) -> Tensor:
    """Token ids ``(batch, length)`` of a text config, ``length`` capped by its positions."""
    text = config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None)
    limit = limit if isinstance(limit, int) and limit > 0 else None
    if limit is None:  # a speech decoder's positions
        limit = getattr(text, "max_target_positions", None)
    t = min(length, int(limit)) if isinstance(limit, int) and limit > 0 else length
    return torch.randint(0, int(text.vocab_size), (batch, t), generator=gen)


def _float_dtype(module: nn.Module) -> torch.dtype:
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


def example_inputs(
    model: LoadedModel | nn.Module, *, batch: int = 2, length: int = 8, seed: int = 0
) -> tuple[Tensor | None, ...]:
    """Small valid positional inputs of a Hugging Face model, from its config alone.

    Text models (main input ``input_ids``): token ids, shape ``(batch, length)``, uniform
    in ``[0, vocab_size)``; ``length`` is capped by the model's maximum positions. Vision
    models (``pixel_values``): standard normal images ``(batch, num_channels, H, W)`` of
    the configured ``image_size`` (a ``vision_config``'s when there is one), in the
    module's dtype. Speech models (``input_features`` with ``num_mel_bins`` mel bins):
    ``(batch, num_mel_bins, 2 * max_source_positions)``, and decoder tokens for an
    encoder-decoder. For
    ``torch.export.export(module, example_inputs(model), strict=False)``.

    Raises:
        HFError: a model whose main input is none of these: pass your own.
    """
    module = model.module if isinstance(model, LoadedModel) else model
    config: Any = module.config  # a transformers PretrainedConfig
    gen = torch.Generator().manual_seed(seed)
    kind = getattr(module, "main_input_name", None)
    if kind == "input_ids":
        ids = _token_ids(config, batch, length, gen)
        if getattr(config, "is_encoder_decoder", False):
            return _with_decoder_inputs(module, ids)
        return (ids,)
    if kind == "pixel_values":
        # a model of several towers (SigLIP, CLIP) keeps its image's sizes in vision_config
        vision = getattr(config, "vision_config", None) or config
        height, width = as_pair(getattr(vision, "image_size", 224))
        channels = int(getattr(vision, "num_channels", 3))
        image = torch.randn(batch, channels, height, width, generator=gen)
        return (image.to(_float_dtype(module)),)
    mels, frames = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", 0)
    if kind == "input_features" and isinstance(mels, int) and isinstance(frames, int):
        # log-mel frames: the encoder's convolutions halve the time axis to its positions
        features = torch.randn(batch, mels, 2 * frames, generator=gen).to(_float_dtype(module))
        if getattr(config, "is_encoder_decoder", False):
            return _with_decoder_inputs(module, features, _token_ids(config, batch, length, gen))
        return (features,)
    raise HFError(
        f"no example inputs for {type(module).__name__} (main input {kind!r}): pass your own"
    )
