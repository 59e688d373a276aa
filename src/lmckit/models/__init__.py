"""The model zoo: built-in architectures, each with its symmetry spec."""

# the architectures register themselves when imported
from lmckit.models import _gpt2, _mlp, _resnet, _vgg, _vit  # noqa: F401
from lmckit.models._registry import (
    ModelConfig,
    ZooModel,
    build_zoo_model,
    create_model,
    get_model_class,
    list_models,
    register_model,
)

__all__ = [
    "ModelConfig",
    "ZooModel",
    "build_zoo_model",
    "create_model",
    "get_model_class",
    "list_models",
    "register_model",
]
