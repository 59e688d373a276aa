"""Registry of built-in architectures: ``@register_model`` plus ``create_model``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lmckit._registry import Registry
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import SymmetrySpec

__all__ = [
    "ModelConfig",
    "ZooModel",
    "check_size_list",
    "check_sizes",
    "create_model",
    "get_model_class",
    "list_models",
    "register_model",
]

_MODELS: Registry[type[ZooModel]] = Registry("model")
# Inferred specs by architecture (class and configuration): a memo of a pure function.
_SPECS: dict[str, SymmetrySpec] = {}


@dataclass(frozen=True)
class ModelConfig:
    """Architecture name and constructor arguments: enough to rebuild the module."""

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"architecture": self.name, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelConfig:
        if not isinstance(data, Mapping) or "architecture" not in data:
            raise ValueError("model config must be an object with an 'architecture' key")
        kwargs = data.get("kwargs", {})
        if not isinstance(kwargs, Mapping):
            raise ValueError("model config 'kwargs' must be an object")
        return cls(str(data["architecture"]), dict(kwargs))

    def __str__(self) -> str:
        return f"{self.name}({json.dumps(dict(self.kwargs), sort_keys=True)})"


class ZooModel(nn.Module):
    """Base of built-in models: a module that knows its own symmetries.

    Subclasses are registered with :func:`register_model`, take JSON-serialisable
    keyword arguments and implement :meth:`example_inputs`; their spec is inferred from
    the traced graph (:func:`lmckit.inference.infer_spec`), with :attr:`space_names` naming
    the spaces. ``config`` is set by :func:`create_model`.
    """

    config: ModelConfig
    #: The name the class is registered under (set by :func:`register_model`).
    registry_name: ClassVar[str]
    #: Space names by the module path of the space's first writer, e.g.
    #: ``{"layers.{i}": "hidden.{i}"}`` (see :func:`lmckit.inference.infer_spec`).
    space_names: ClassVar[Mapping[str, str]] = {}

    def example_inputs(self) -> tuple[Tensor, ...]:
        """A small seeded batch of valid inputs (two examples), for tracing."""
        raise NotImplementedError

    def symmetry_spec(self) -> SymmetrySpec:
        """The architecture's symmetries, inferred from its graph and verified.

        Inferred once per architecture configuration (the spec depends on the
        architecture, not on the weights) and reused.
        """
        config = self.__dict__.get("config")
        key = f"{type(self).__module__}.{type(self).__qualname__}:{config}"
        if config is None or key not in _SPECS:
            from lmckit.inference import infer_spec

            spec = infer_spec(self, self.example_inputs(), names=self.space_names)
            if config is None:
                return spec
            _SPECS[key] = spec
        return _SPECS[key]

    def repair_sites(self) -> list[str]:
        """Modules whose per-channel outputs REPAIR rescales (Linear/Conv/norm layers).

        Each named module must have a ``weight`` whose axis 0 is the channel axis and
        may have a ``bias``; the correction is folded into them.
        """
        return []


def register_model(name: str) -> Callable[[type[ZooModel]], type[ZooModel]]:
    """Class decorator adding an architecture to the zoo under ``name``."""

    def deco(cls: type[ZooModel]) -> type[ZooModel]:
        _MODELS.add(name, cls)
        cls.registry_name = name
        return cls

    return deco


def check_sizes(model: str, **sizes: object) -> None:
    """Raise ``ValueError`` naming the first size that is not a positive integer."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            # a config.json written by hand may quote its numbers: say so
            hint = " (a string: write the number without quotes)" if isinstance(value, str) else ""
            raise ValueError(f"{model}: {name} must be a positive integer, got {value!r}{hint}")


def check_size_list(model: str, name: str, values: object) -> None:
    """Raise ``ValueError`` unless ``values`` is a list of positive integers (one per layer)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        hint = " (a string: write a list of numbers, e.g. [32])" if isinstance(values, str) else ""
        raise ValueError(
            f"{model}: {name} must be a list of positive integers, got {values!r}{hint}"
        )
    check_sizes(model, **{f"{name}[{i}]": v for i, v in enumerate(values)})


def list_models() -> list[str]:
    """Names of the zoo's architectures, sorted."""
    return _MODELS.names()


def get_model_class(name: str) -> type[ZooModel]:
    """The class registered as ``name`` (``KeyError`` listing the valid names)."""
    return _MODELS.get(name)


def build_zoo_model(config: ModelConfig) -> ZooModel:
    """Construct the module of ``config`` (weights as initialised by PyTorch's RNG)."""
    cls = get_model_class(config.name)
    try:
        module = cls(**config.kwargs)
    except TypeError as err:
        raise ValueError(f"bad arguments for model {config.name!r}: {err}") from None
    module.config = config
    return module


def create_model(name: str, *, seed: int = 0, **kwargs: Any) -> tuple[ZooModel, Params]:
    """Build a zoo model and its initial parameters from ``seed``.

    The global RNG is left as it was: initialisation runs under a forked RNG.

    Returns:
        ``(module, params)``; ``params`` is a detached copy of the state dict.
    """
    config = ModelConfig(name, kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build_zoo_model(config)
    params = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return module, params
