"""The model zoo: built-in architectures, each with its symmetry spec."""

from lmckit.models import asymmetric as asymmetric  # noqa: F401  (not in the registry)
from lmckit.models import gpt2 as _gpt2  # noqa: F401  (registers the architectures)
from lmckit.models import mlp as _mlp  # noqa: F401
from lmckit.models import resnet as _resnet  # noqa: F401
from lmckit.models import vgg as _vgg  # noqa: F401
from lmckit.models import vit as _vit  # noqa: F401
from lmckit.models.registry import (
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
