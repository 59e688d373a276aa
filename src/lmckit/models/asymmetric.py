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

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.models.mlp import MLP
from lmckit.models.registry import ModelConfig, ZooModel, create_model
from lmckit.models.resnet import ResNet20
from lmckit.models.vit import ViT
from lmckit.params import Params
from lmckit.symmetry import SymmetrySpec

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

MODES = ("wasym", "syre")


def _layer_generator(seed: int, layer: int) -> torch.Generator:
    # one independent stream per (seed, layer): the same layer gets the same draw in
    # every run, and layers do not share draws
    state = np.random.SeedSequence([int(seed), int(layer)]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


def asym_parts(
    shape: Sequence[int],
    *,
    kappa: float,
    num_fixed: int,
    mode: str,
    mask_seed: int,
    fixed_seed: int,
    layer: int,
) -> tuple[Tensor, Tensor]:
    """Mask ``M`` and offset ``C`` of one layer (both of ``shape``, ``(out, ...)``).

    ``wasym``: ``num_fixed`` entries per row of the flattened ``(out, fan_in)`` weight
    are fixed, chosen uniformly without replacement; ``C = (1 - M) ⊙ κF``.
    ``syre``: ``M = 1``, ``C = κF``. ``F ~ N(0, 1)`` i.i.d.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not math.isfinite(kappa) or kappa < 0:
        raise ValueError(f"kappa must be a finite number >= 0, got {kappa}")
    out = int(shape[0])
    fan_in = math.prod(shape[1:])
    fixed = torch.randn(tuple(shape), generator=_layer_generator(fixed_seed, layer))
    if mode == "syre":
        return torch.ones(tuple(shape)), kappa * fixed
    if not 0 <= num_fixed <= fan_in:
        raise ValueError(f"num_fixed must be in [0, {fan_in}] for weight {tuple(shape)}")
    scores = torch.rand(out, fan_in, generator=_layer_generator(mask_seed, layer))
    chosen = scores.argsort(dim=1)[:, :num_fixed]
    mask = torch.ones(out, fan_in).scatter_(1, chosen, 0.0).reshape(tuple(shape))
    return mask, (1 - mask) * kappa * fixed


def fold_weight(weight: Tensor, mask: Tensor, offset: Tensor) -> Tensor:
    """Effective weight ``M ⊙ W + C``."""
    if not weight.shape == mask.shape == offset.shape:
        raise ValueError(
            f"weight {tuple(weight.shape)}, mask {tuple(mask.shape)} and offset "
            f"{tuple(offset.shape)} must have one shape"
        )
    return mask * weight + offset


class _AsymWeight(nn.Module):
    """A weight ``W`` (parameter), bias, and fixed ``mask``/``offset`` buffers."""

    weight: nn.Parameter
    mask: Tensor
    offset: Tensor

    def _init_parts(
        self, weight: Tensor, bias: Tensor | None, mask: Tensor, offset: Tensor
    ) -> None:
        # fixed entries of W never matter; zero them so the parameters are tidy
        self.weight = nn.Parameter(weight.detach() * mask)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.register_buffer("mask", mask)
        self.register_buffer("offset", offset)

    def effective_weight(self) -> Tensor:
        """``M ⊙ W + C``: the weight of the equivalent plain layer."""
        return self.mask * self.weight + self.offset


class AsymLinear(_AsymWeight):
    """``y = x (M ⊙ W + C)^T + b``; ``x: (..., in_features) -> (..., out_features)``."""

    def __init__(self, linear: nn.Linear, mask: Tensor, offset: Tensor) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._init_parts(linear.weight, linear.bias, mask, offset)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.effective_weight(), self.bias)


class AsymConv2d(_AsymWeight):
    """A Conv2d with weight ``M ⊙ W + C`` (``(out, in, kh, kw)``); same stride/padding."""

    def __init__(self, conv: nn.Conv2d, mask: Tensor, offset: Tensor) -> None:
        super().__init__()
        if conv.padding_mode != "zeros":
            raise ValueError("only zero-padded convolutions can be made asymmetric")
        self.stride, self.padding = conv.stride, conv.padding
        self.dilation, self.groups = conv.dilation, conv.groups
        self._init_parts(conv.weight, conv.bias, mask, offset)

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(
            x,
            self.effective_weight(),
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )


def _asymmetrize(
    model: nn.Module,
    *,
    kappa: float,
    num_fixed: int | Sequence[int] | None,
    mode: str,
    mask_seed: int,
    fixed_seed: int,
    select: Callable[[str], bool] | None = None,
) -> list[str]:
    """Replace the Linear/Conv2d layers of ``model`` in place; return their names in order.

    ``num_fixed``: one count for all layers, one per layer, or ``None`` for an eighth
    of each row's entries (at least one). ``select(name)`` picks the layers by module
    name (default: all); layer ``k`` of the selection draws stream ``k`` of each seed.
    """
    targets = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear | nn.Conv2d) and (select is None or select(name))
    ]
    if isinstance(num_fixed, Sequence):
        counts = [int(c) for c in num_fixed]
        if len(counts) != len(targets):
            raise ValueError(
                f"num_fixed lists {len(counts)} counts for {len(targets)} layers "
                f"({', '.join(n for n, _ in targets)})"
            )
    else:
        counts = [
            max(1, math.prod(m.weight.shape[1:]) // 8) if num_fixed is None else int(num_fixed)
            for _, m in targets
        ]
    for layer, ((name, module), count) in enumerate(zip(targets, counts, strict=True)):
        mask, offset = asym_parts(
            module.weight.shape,
            kappa=kappa,
            num_fixed=count,
            mode=mode,
            mask_seed=mask_seed,
            fixed_seed=fixed_seed,
            layer=layer,
        )
        new: nn.Module
        if isinstance(module, nn.Linear):
            new = AsymLinear(module, mask, offset)
        else:
            new = AsymConv2d(module, mask, offset)
        parent, _, leaf = name.rpartition(".")
        model.get_submodule(parent).register_module(leaf, new)
    return [name for name, _ in targets]


class AsymmetricModel(ZooModel):
    """Mixin of the asymmetric zoo variants: the plain model they fold into.

    Subclasses set ``plain_name`` (the zoo name of the plain architecture),
    ``plain_kwargs`` (its constructor arguments) and ``asym_layers`` (names of the
    asymmetric layers).
    """

    plain_name: str
    plain_kwargs: dict[str, Any]
    asym_layers: list[str]

    def symmetry_spec(self) -> SymmetrySpec:
        raise ValueError(
            f"{type(self).__name__} has no parameter symmetries by construction; align "
            "its plain form: plain, params = to_plain(module, params); plain.symmetry_spec()"
        )

    def repair_sites(self) -> list[str]:
        # REPAIR folds into Linear/Conv weights; do it on the plain form (to_plain)
        return []


_ASYM_DOC = """
    Extra keyword arguments (all JSON-serialisable):
        kappa: fixed-weight scale ``κ`` (``C = (1 - M) ⊙ κF`` or ``κF``).
        num_fixed: fixed entries per row (``wasym``): one int for every layer, a list
            with one per Linear/Conv (in module order), or ``None`` for an eighth.
        mask_seed, fixed_seed: seeds of ``M`` and ``F``, shared across runs.
        mode: ``"wasym"`` or ``"syre"``.
"""


class AsymMLP(AsymmetricModel, MLP):
    """The zoo MLP with every Linear (hidden layers and head) made asymmetric.

    ``(batch, ...) -> (batch, out_features)``; plain form: ``"mlp"``.
    """

    __doc__ = (__doc__ or "") + _ASYM_DOC

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int],
        out_features: int,
        *,
        activation: str = "relu",
        norm: str = "none",
        bias: bool = True,
        kappa: float = 1.0,
        num_fixed: int | Sequence[int] | None = None,
        mask_seed: int = 0,
        fixed_seed: int = 0,
        mode: str = "wasym",
    ) -> None:
        super().__init__(
            in_features, hidden, out_features, activation=activation, norm=norm, bias=bias
        )
        self.plain_name = "mlp"
        self.plain_kwargs = {
            "in_features": in_features,
            "hidden": list(hidden),
            "out_features": out_features,
            "activation": activation,
            "norm": norm,
            "bias": bias,
        }
        self.asym_layers = _asymmetrize(
            self,
            kappa=kappa,
            num_fixed=num_fixed,
            mode=mode,
            mask_seed=mask_seed,
            fixed_seed=fixed_seed,
        )


class AsymResNet20(AsymmetricModel, ResNet20):
    """The zoo ResNet20 with every Conv2d and the classifier made asymmetric.

    ``(batch, in_channels, H, W) -> (batch, num_classes)``; plain form: ``"resnet20"``.
    """

    __doc__ = (__doc__ or "") + _ASYM_DOC

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width_mult: int = 1,
        norm: str = "batch",
        *,
        kappa: float = 1.0,
        num_fixed: int | Sequence[int] | None = None,
        mask_seed: int = 0,
        fixed_seed: int = 0,
        mode: str = "wasym",
    ) -> None:
        super().__init__(in_channels, num_classes, width_mult=width_mult, norm=norm)
        self.plain_name = "resnet20"
        self.plain_kwargs = {
            "in_channels": in_channels,
            "num_classes": num_classes,
            "width_mult": width_mult,
            "norm": norm,
        }
        self.asym_layers = _asymmetrize(
            self,
            kappa=kappa,
            num_fixed=num_fixed,
            mode=mode,
            mask_seed=mask_seed,
            fixed_seed=fixed_seed,
        )


def _in_vit_block(name: str) -> bool:
    # the six projections of each encoder block (module names as in lmckit.models.vit);
    # the patch embedding (Conv2d) and the classifier are outside the encoder
    return name.startswith("vit.encoder.layer.")


class AsymViT(AsymmetricModel, ViT):
    """The zoo ViT with the attention and MLP Linears of every block made asymmetric.

    Asymmetric: ``attention.attention.{query,key,value}``, ``attention.output.dense``,
    ``intermediate.dense`` and ``output.dense`` of each ``vit.encoder.layer.{i}`` (six per
    block, in that module order). The patch embedding, position embeddings, class token,
    norms and classifier stay plain.
    ``(batch, in_channels, image_size, image_size) -> (batch, num_classes)``; plain
    form: ``"vit"`` (same parameter names after folding).
    """

    __doc__ = (__doc__ or "") + _ASYM_DOC

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        in_channels: int,
        num_classes: int,
        width: int = 64,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        mlp_dim: int | None = None,
        *,
        class_token: bool = True,
        norm: str = "layer",
        layer_norm_eps: float = 1e-6,
        kappa: float = 1.0,
        num_fixed: int | Sequence[int] | None = None,
        mask_seed: int = 0,
        fixed_seed: int = 0,
        mode: str = "wasym",
    ) -> None:
        super().__init__(
            image_size,
            patch_size,
            in_channels,
            num_classes,
            width=width,
            depth=depth,
            heads=heads,
            mlp_ratio=mlp_ratio,
            mlp_dim=mlp_dim,
            class_token=class_token,
            norm=norm,
            layer_norm_eps=layer_norm_eps,
        )
        self.plain_name = "vit"
        self.plain_kwargs = {
            "image_size": image_size,
            "patch_size": patch_size,
            "in_channels": in_channels,
            "num_classes": num_classes,
            "width": width,
            "depth": depth,
            "heads": heads,
            "mlp_ratio": mlp_ratio,
            "mlp_dim": mlp_dim,
            "class_token": class_token,
            "norm": norm,
            "layer_norm_eps": layer_norm_eps,
        }
        self.asym_layers = _asymmetrize(
            self,
            kappa=kappa,
            num_fixed=num_fixed,
            mode=mode,
            mask_seed=mask_seed,
            fixed_seed=fixed_seed,
            select=_in_vit_block,
        )


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
