"""Symmetry-broken layers and models: W-asymmetric and syre networks.

Every weight matrix is replaced by an effective weight (Lim et al., 2024b; Ziyin et al.,
2025; Boehm et al., "Beyond structural symmetries", eq. 2)::

    W_eff = M ⊙ W + C        (out, fan_in), fan_in = in_features or in_channels * kh * kw

* ``mode="wasym"``: ``M`` is a 0/1 mask with exactly ``num_fixed`` zeros per row
  (neuron), ``C = (1 - M) ⊙ κF``: the masked entries are frozen at ``κF``.
* ``mode="syre"``: ``M = 1`` and ``C = κF`` (a fixed random offset on every entry).

``F`` has i.i.d. standard-normal entries and ``κ`` (``kappa``) is the fixed-weight
scale. ``M`` comes from ``mask_seed`` and ``F`` from ``fixed_seed`` (each layer draws
from its own stream of the seed), so independent training runs that share the seeds
share the fixed parts of the architecture. ``M`` and ``C`` are buffers (``mask`` and
``offset``); only ``W`` and the bias are parameters, and the gradient of ``W`` is zero
on fixed entries because ``M`` multiplies it.

Symmetry specs: the asymmetric models have **no** symmetry spec (their fixed parts
break the permutation symmetry by design, so no transform of their parameters keeps
the function). The route to every aligner and path tool is :func:`to_plain`, which
folds ``M ⊙ W + C`` into the plain zoo model computing the same function; its
``symmetry_spec()`` is the plain model's. Because the fold is affine with the same
``M`` and ``C`` at both ends, the linear path between two folded models is the fold of
the linear path between the asymmetric ones: unaligned barriers agree in both views.

The models are built by :func:`create_asym_model`, not the zoo registry: the zoo's
tests assert that each registered spec is function-preserving, which an asymmetric
model must violate.

Which layers: every Linear/Conv2d of the MLP and ResNet20 (head included); in the ViT the
attention projections (query, key, value, output) and the MLP (intermediate, output
dense) of every block, so the head, FFN and residual symmetries are all broken while the
patch embedding and classifier stay plain.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from lmckit.experiments._identifiability._asym_layers import (
    MODES,
    AsymConv2d,
    AsymLinear,
    asym_parts,
    asymmetrize,
    fold_weight,
)
from lmckit.models._mlp import MLP
from lmckit.models._registry import ModelConfig, ZooModel, create_model, get_model_class
from lmckit.models._resnet import ResNet20
from lmckit.models._vit import ViT
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import SymmetrySpec

__all__ = [
    "MODES",
    "AsymConv2d",
    "AsymLinear",
    "AsymMLP",
    "AsymResNet20",
    "AsymViT",
    "AsymmetricModel",
    "asym_parts",
    "create_asym_model",
    "fold_weight",
    "list_asym_models",
    "to_plain",
]


class AsymmetricModel(ZooModel):
    """Base of the asymmetric zoo variants: a plain zoo model whose layers were made
    asymmetric after it was built, and the plain model it folds into.

    A variant subclasses this and the plain class (``class AsymMLP(AsymmetricModel,
    MLP)``) and sets ``plain_name``, the plain architecture's zoo name, and optionally
    ``layer_prefix``: only Linear/Conv2d layers whose module names start with it are made
    asymmetric (default: all). Its
    constructor takes the plain class's arguments plus the asymmetry options::

        kappa: fixed-weight scale ``κ`` (``C = (1 - M) ⊙ κF`` or ``κF``).
        num_fixed: fixed entries per row (``wasym``): one int for every layer, a list
            with one per Linear/Conv (in module order), or ``None`` for an eighth.
        mask_seed, fixed_seed: seeds of ``M`` and ``F``, shared across runs.
        mode: ``"wasym"`` or ``"syre"``.

    Attributes:
        plain_kwargs: the plain constructor's arguments, defaults filled in.
        asym_layers: names of the asymmetric layers, in module order.
    """

    plain_name: ClassVar[str]
    layer_prefix: ClassVar[str] = ""
    plain_kwargs: dict[str, Any]
    asym_layers: list[str]

    def __init__(
        self,
        *args: Any,
        kappa: float = 1.0,
        num_fixed: int | Sequence[int] | None = None,
        mask_seed: int = 0,
        fixed_seed: int = 0,
        mode: str = "wasym",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)  # the plain class's, next in the MRO
        bound = inspect.signature(get_model_class(self.plain_name)).bind(*args, **kwargs)
        bound.apply_defaults()
        # JSON-ready: sequences (hidden widths) as lists
        self.plain_kwargs = {
            k: list(v) if isinstance(v, tuple) else v for k, v in bound.arguments.items()
        }
        self.asym_layers = asymmetrize(
            self,
            kappa=kappa,
            num_fixed=num_fixed,
            mode=mode,
            mask_seed=mask_seed,
            fixed_seed=fixed_seed,
            select=lambda name: name.startswith(self.layer_prefix),
        )

    def symmetry_spec(self) -> SymmetrySpec:
        raise ValueError(
            f"{type(self).__name__} has no parameter symmetries by construction; align "
            "its plain form: plain, params = to_plain(module, params); plain.symmetry_spec()"
        )

    def repair_sites(self) -> list[str]:
        # REPAIR folds into Linear/Conv weights; do it on the plain form (to_plain)
        return []


class AsymMLP(AsymmetricModel, MLP):
    """The zoo MLP with every Linear (hidden layers and head) made asymmetric.

    ``(batch, ...) -> (batch, out_features)``; arguments: :class:`MLP`'s and the
    asymmetry options (:class:`AsymmetricModel`); plain form: ``"mlp"``.
    """

    plain_name = "mlp"


class AsymResNet20(AsymmetricModel, ResNet20):
    """The zoo ResNet20 with every Conv2d and the classifier made asymmetric.

    ``(batch, in_channels, H, W) -> (batch, num_classes)``; arguments: :class:`ResNet20`'s
    and the asymmetry options (:class:`AsymmetricModel`); plain form: ``"resnet20"``.
    """

    plain_name = "resnet20"


class AsymViT(AsymmetricModel, ViT):
    """The zoo ViT with the attention and MLP Linears of every block made asymmetric.

    Asymmetric: ``attention.attention.{query,key,value}``, ``attention.output.dense``,
    ``intermediate.dense`` and ``output.dense`` of each ``vit.encoder.layer.{i}`` (six per
    block, in that module order). The patch embedding, position embeddings, class token,
    norms and classifier stay plain.
    ``(batch, in_channels, image_size, image_size) -> (batch, num_classes)``; arguments:
    :class:`ViT`'s and the asymmetry options (:class:`AsymmetricModel`); plain form:
    ``"vit"`` (same parameter names after folding).
    """

    plain_name = "vit"
    # the six projections of each encoder block (module names as in lmckit.models._vit);
    # the patch embedding (Conv2d) and the classifier are outside the encoder
    layer_prefix = "vit.encoder.layer."


_ASYM_MODELS: dict[str, Callable[..., AsymmetricModel]] = {
    "asym_mlp": AsymMLP,
    "asym_resnet20": AsymResNet20,
    "asym_vit": AsymViT,
}


def list_asym_models() -> list[str]:
    """Names accepted by :func:`create_asym_model`."""
    return sorted(_ASYM_MODELS)


def create_asym_model(name: str, *, seed: int = 0, **kwargs: Any) -> tuple[AsymmetricModel, Params]:
    """Build an asymmetric model and its initial parameters.

    ``seed`` draws the trainable weights (under a forked RNG, like ``create_model``);
    ``mask_seed`` and ``fixed_seed`` in ``kwargs`` draw the fixed parts.

    Returns:
        ``(module, params)``; ``params`` holds ``W``, biases, norms and the ``mask`` /
        ``offset`` buffers of each asymmetric layer.
    """
    try:
        cls = _ASYM_MODELS[name]
    except KeyError:
        raise KeyError(
            f"unknown asymmetric model {name!r}; known: {', '.join(list_asym_models())}"
        ) from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            module = cls(**kwargs)
        except TypeError as err:
            raise ValueError(f"bad arguments for model {name!r}: {err}") from None
    module.config = ModelConfig(name, kwargs)
    params = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return module, params


def to_plain(module: AsymmetricModel, params: Mapping[str, Tensor]) -> tuple[ZooModel, Params]:
    """The plain zoo model computing the same function, with folded parameters.

    Each asymmetric layer's ``weight`` becomes ``mask ⊙ weight + offset`` (taken from
    ``params``, so the fold is a pure function of them); its ``mask``/``offset`` entries
    are dropped; every other tensor is copied.

    Returns:
        ``(plain module, plain params)``; ``plain.symmetry_spec()`` applies to them.
    """
    if not isinstance(module, AsymmetricModel):
        raise ValueError(f"expected an asymmetric model, got {type(module).__name__}")
    plain, reference = create_model(module.plain_name, **module.plain_kwargs)
    layers = set(module.asym_layers)
    out: Params = {}
    for key, value in params.items():
        owner, _, leaf = key.rpartition(".")
        if owner in layers and leaf in ("mask", "offset"):
            continue
        if owner in layers and leaf == "weight":
            out[key] = fold_weight(value, params[f"{owner}.mask"], params[f"{owner}.offset"])
        else:
            out[key] = value.clone()
    if out.keys() != reference.keys():
        missing = sorted(set(reference) - set(out))
        extra = sorted(set(out) - set(reference))
        raise ValueError(f"params do not fit {module.plain_name}: missing {missing}, extra {extra}")
    return plain, out
