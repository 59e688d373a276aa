"""Vision Transformer (Dosovitskiy et al., 2021) for image classification.

Module names follow Hugging Face's ``ViTForImageClassification`` (separate Q, K, V
projections)::

    vit.embeddings.cls_token                          (1, 1, width)
    vit.embeddings.position_embeddings                (1, tokens, width)
    vit.embeddings.patch_embeddings.projection        Conv2d(in_channels, width, p, stride p)
    vit.encoder.layer.{i}.layernorm_before            norm over width
    vit.encoder.layer.{i}.attention.attention.query   Linear(width, width) (key, value alike)
    vit.encoder.layer.{i}.attention.output.dense      Linear(width, width)
    vit.encoder.layer.{i}.layernorm_after             norm over width
    vit.encoder.layer.{i}.intermediate.dense          Linear(width, mlp_dim), then GELU
    vit.encoder.layer.{i}.output.dense                Linear(mlp_dim, width)
    vit.layernorm                                     norm over width
    classifier                                        Linear(width, num_classes)

The classifier reads the class token (``class_token=True``) or the mean of the patch
tokens. Spaces: ``residual``, ``heads.{i}``, ``ffn.{i}`` as for GPT-2. With
``attention="circuits"`` each ``vit.encoder.layer.{i}.attention`` is a
:class:`~lmckit.models._transformer_blocks.CircuitAttention`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lmckit.models._registry import ZooModel, register_model
from lmckit.models._transformer_blocks import (
    CircuitAttention,
    check_attention_form,
    check_transformer_norm,
    make_residual_norm,
    multi_head_attention,
)
from lmckit.symmetry._params import Params

__all__ = ["ViT"]


class _PatchEmbeddings(nn.Module):
    def __init__(self, in_channels: int, width: int, patch_size: int) -> None:
        super().__init__()
        self.projection = nn.Conv2d(in_channels, width, patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.projection(x).flatten(2).transpose(1, 2)  # (batch, patches, width)


class _Embeddings(nn.Module):
    def __init__(
        self, in_channels: int, width: int, patch_size: int, patches: int, class_token: bool
    ) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width)) if class_token else None
        tokens = patches + int(class_token)
        self.position_embeddings = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.patch_embeddings = _PatchEmbeddings(in_channels, width, patch_size)
        self.dropout = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.patch_embeddings(x)
        if self.cls_token is not None:
            tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        return self.dropout(tokens + self.position_embeddings)


class _SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width)
        self.value = nn.Linear(width, width)
        self.n_head = heads

    def forward(self, x: Tensor) -> Tensor:
        return multi_head_attention(
            self.query(x), self.key(x), self.value(x), self.n_head, causal=False
        )


class _Dense(nn.Module):
    def __init__(self, width_in: int, width_out: int, act: bool) -> None:
        super().__init__()
        self.dense = nn.Linear(width_in, width_out)
        self.intermediate_act_fn = nn.GELU() if act else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.intermediate_act_fn(self.dense(x))


class _Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attention = _SelfAttention(width, heads)
        self.output = _Dense(width, width, act=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.output(self.attention(x))


class _Layer(nn.Module):
    """Pre-norm block: ``x + attn(layernorm_before(x))``, ``x + mlp(layernorm_after(x))``."""

    def __init__(
        self, width: int, heads: int, mlp_dim: int, norm: str, eps: float, attention: str
    ) -> None:
        super().__init__()
        self.layernorm_before = make_residual_norm(norm, width, eps)
        self.attention: nn.Module
        if attention == "heads":
            self.attention = _Attention(width, heads)
        else:
            self.attention = CircuitAttention(width, heads, causal=False)
        self.layernorm_after = make_residual_norm(norm, width, eps)
        self.intermediate = _Dense(width, mlp_dim, act=True)
        self.output = _Dense(mlp_dim, width, act=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.layernorm_before(x))
        return x + self.output(self.intermediate(self.layernorm_after(x)))


@register_model("vit")
class ViT(ZooModel):
    """ViT classifier: images ``(batch, in_channels, image_size, image_size)`` -> logits.

    Args:
        image_size, patch_size: square images cut into ``(image_size / patch_size)^2``
            non-overlapping patches.
        in_channels, num_classes: data sizes.
        width, depth, heads: residual width, number of layers, heads per layer.
        mlp_ratio: MLP width over ``width`` (ignored when ``mlp_dim`` is given).
        mlp_dim: MLP width.
        class_token: classify from a learned class token (else mean of the tokens).
        norm: ``"layer"`` or ``"rms"`` (see :mod:`lmckit.models._transformer_blocks`).
        layer_norm_eps: the norms' ``eps``.
        attention: ``"heads"`` (projections) or ``"circuits"`` (each head's QK and OV
            circuit, see :func:`lmckit.forms.heads_to_circuits`).
    """

    space_names = {
        "vit.encoder.layer.{i}.attention": "heads.{i}",
        "vit.encoder.layer.{i}.attention.attention.query": "heads.{i}",
        "vit.encoder.layer.{i}.intermediate.dense": "ffn.{i}",
    }

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
        attention: str = "heads",
    ) -> None:
        super().__init__()
        check_transformer_norm(norm)
        check_attention_form(attention)
        if min(image_size, patch_size, in_channels, num_classes, width, depth, heads) < 1:
            raise ValueError("ViT sizes must be positive")
        if image_size % patch_size:
            raise ValueError(f"image_size={image_size} is not a multiple of patch={patch_size}")
        if width % heads:
            raise ValueError(f"width={width} is not a multiple of heads={heads}")
        mlp_dim = round(width * mlp_ratio) if mlp_dim is None else mlp_dim
        patches = (image_size // patch_size) ** 2
        self.vit = nn.Module()
        self.vit.embeddings = _Embeddings(in_channels, width, patch_size, patches, class_token)
        self.vit.encoder = nn.Module()
        self.vit.encoder.layer = nn.ModuleList(
            _Layer(width, heads, mlp_dim, norm, layer_norm_eps, attention) for _ in range(depth)
        )
        self.vit.layernorm = make_residual_norm(norm, width, layer_norm_eps)
        self.classifier = nn.Linear(width, num_classes)
        self.width, self.depth, self.heads, self.mlp_dim = width, depth, heads, mlp_dim
        self.norm, self.class_token, self.layer_norm_eps = norm, class_token, layer_norm_eps
        self.attention = attention
        self.image_size, self.in_channels = image_size, in_channels

    def forward(self, x: Tensor) -> Tensor:
        h = self.vit.embeddings(x)
        for layer in self.vit.encoder.layer:
            h = layer(h)
        h = self.vit.layernorm(h)
        return self.classifier(h[:, 0] if self.class_token else h.mean(1))

    def example_inputs(self) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        size = self.image_size
        return (torch.randn(2, self.in_channels, size, size, generator=gen),)

    def repair_sites(self) -> list[str]:
        return [f"vit.encoder.layer.{i}.intermediate.dense" for i in range(self.depth)]

    def untied(self, params: Params) -> Params:
        """``params`` unchanged (a ViT shares no weights)."""
        return dict(params)

    def rms_kwargs(self) -> dict[str, Any]:
        """Constructor changes for the RMSNorm form."""
        return {"norm": "rms"}

    def widened_kwargs(self, width: int, inner: int) -> dict[str, Any]:
        """Constructor changes for a model of residual width ``width``, MLP width ``inner``."""
        # see GPT2.widened_kwargs: eps scales with n / width
        eps = self.layer_norm_eps * self.width / width
        return {"width": width, "mlp_dim": inner, "layer_norm_eps": eps}
