"""Layouts of vision models, read from each family's ``modeling_*.py``."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import torch

from .engine import QK, Block, Layout, Norm, Stream, Units
from .layouts import attention, layout, mlp


@dataclass(frozen=True)
class Vit:
    """A pre-LayerNorm ViT's names under ``base``: a patch convolution and ``tokens``
    (class token, positions; their feature axis last) write the stream, the classifier
    reads it (``extra_uses``, ``extra_scales``: anything else); ``per_head``: a relative
    position table per layer, one column per head; ``rotates``: every norm folds into the
    layers reading it (the last into the classifier)."""

    base: str
    tokens: tuple[str, ...]
    layer: str = "layers"
    per_head: str = ""
    norms: tuple[str, str] = ("layernorm_before", "layernorm_after")
    final: str = "layernorm"
    extra_uses: tuple[Any, ...] = ()
    extra_scales: tuple[Any, ...] = ()
    ffn: int | None = None
    names: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj")
    attn: str = "attention"
    key_bias: bool = True
    rotates: bool = False


def _vit_stream(cfg: Any, how: Vit) -> Stream:
    base, lay = re.escape(how.base), re.escape(f"{how.base}.{how.layer}.") + r"\d+\."
    final = re.escape(how.final)
    q, k, v, o = how.names
    norm = rf"({'|'.join(how.norms)})"
    stream = Stream(
        (
            (rf"{base}\.embeddings\.patch_embeddings?(\.projection)?\.(weight|bias)", 0),
            *((rf"{base}\.embeddings\.{t}", -1) for t in how.tokens),
            (lay + rf"{how.attn}\.({q}|{k}|{v})\.weight", 1),
            (lay + rf"{how.attn}\.{o}\.(weight|bias)", 0),
            (lay + r"mlp\.fc1\.weight", 1),
            (lay + r"mlp\.fc2\.(weight|bias)", 0),
            (lay + norm + r"\.bias", 0),
            (rf"{base}\.{final}\.bias", 0),
            (r"classifier\.weight", 1),
            *how.extra_uses,
        ),
        ((lay + norm + r"\.weight", 0), (rf"{base}\.{final}\.weight", 0), *how.extra_scales),
        centered=True,
    )
    return replace(stream, norms=_vit_norms(cfg, how)) if how.rotates else stream


def _vit_norms(cfg: Any, how: Vit) -> tuple[Norm, ...]:
    pre, last = f"{how.base}.{how.layer}.{{}}.", f"{how.base}.{how.final}"
    found = [Norm(last + ".weight", (("classifier.weight", 1),), last + ".bias")]
    for i in range(cfg.num_hidden_layers):
        before, after = (pre.format(i) + n for n in how.norms)
        readers = tuple((pre.format(i) + f"{how.attn}.{n}.weight", 1) for n in how.names[:3])
        found.append(Norm(before + ".weight", readers, before + ".bias"))
        fc1 = ((pre.format(i) + "mlp.fc1.weight", 1),)
        found.append(Norm(after + ".weight", fc1, after + ".bias"))
    return tuple(found)


def vit_like(cfg: Any, how: Vit) -> Layout:
    """A pre-LayerNorm ViT's layout (see :class:`Vit`)."""
    pre = f"{how.base}.{how.layer}.{{}}."
    heads = torch.arange(cfg.num_attention_heads).view(-1, 1)
    atts, units = [], []
    for i in range(cfg.num_hidden_layers):
        table = (Block(pre.format(i) + how.per_head, 1, heads),) if how.per_head else ()
        att = attention(pre.format(i) + how.attn + ".", cfg, QK("full"), bias=True,
                        names=how.names, per_head=table)  # fmt: skip
        atts.append(att if how.key_bias else replace(att, k=att.k[:1]))
        ffn = how.ffn or cfg.intermediate_size
        units.append(mlp([pre.format(i) + "mlp.fc1"], pre.format(i) + "mlp.fc2", ffn, bias=True))
    return Layout((_vit_stream(cfg, how),), tuple(units), (), tuple(atts))


@layout("vit")
def _vit(cfg: Any) -> Layout:  # the class token and learned positions write the stream
    return vit_like(cfg, Vit("vit", ("cls_token", "position_embeddings"), rotates=True))


@layout("deit")
def _deit(cfg: Any) -> Layout:  # a distillation token beside the class token
    tokens = ("cls_token", "distillation_token", "position_embeddings")
    return vit_like(cfg, Vit("deit", tokens, rotates=True))


@layout("beit")
def _beit(cfg: Any) -> Layout:
    # a relative position table per layer (a column per head); layer scales lambda_1,
    # lambda_2 on each block's output; no key bias; the mean of the patch tokens goes
    # through pooler.layernorm to the classifier
    return vit_like(
        cfg,
        Vit(
            "beit",
            tokens=("cls_token",),
            per_head="relative_position_bias.relative_position_bias_table",
            extra_uses=((r"beit\.layers\.\d+\.lambda_[12]", 0),),
            final="pooler.layernorm",
            key_bias=False,
        ),
    )


@layout("dinov2")
def _dinov2(cfg: Any) -> Layout:
    # layer scales on each block's output; the classifier reads the class token and the
    # mean of the patch tokens concatenated: two copies of the stream side by side
    base = vit_like(
        cfg,
        Vit(
            "dinov2",
            tokens=("cls_token", "mask_token", "position_embeddings"),
            layer="encoder.layer",
            norms=("norm1", "norm2"),
            ffn=cfg.mlp_ratio * cfg.hidden_size,
            extra_uses=((r"dinov2\.encoder\.layer\.\d+\.layer_scale[12]\.lambda1", 0),),
        ),
    )
    (stream,) = base.streams
    uses = tuple(u for u in stream.uses if u[0] != r"classifier\.weight")
    stream = Stream((*uses, (r"classifier\.weight", 1, 2)), stream.scales, stream.centered)
    return Layout((stream,), base.units, base.experts, base.attention)


@layout("siglip")
def _siglip(cfg: Any) -> Layout:  # the classifier reads the mean of the tokens
    vision = cfg.vision_config
    return vit_like(
        vision,
        Vit(
            "vision_model",
            tokens=(),
            layer="encoder.layers",
            norms=("layer_norm1", "layer_norm2"),
            final="post_layernorm",
            extra_uses=((r"vision_model\.embeddings\.position_embedding\.weight", 1),),
            names=("q_proj", "k_proj", "v_proj", "out_proj"),
            attn="self_attn",
            rotates=True,
        ),
    )


@layout("swin")
def _swin(cfg: Any) -> Layout:
    # a stream per stage; patch merging concatenates four neighbouring tokens' features
    # (four copies of the stage's stream) into downsample.norm and .reduction, whose rows
    # write the next stage's stream; windowed attention with a relative position table
    # per block (a column per head)
    streams, units, atts = [], [], []
    stages = len(cfg.depths)
    for s in range(stages):
        dim, stage = cfg.embed_dim * 2**s, rf"swin\.encoder\.layers\.{s}\."
        block = stage + r"blocks\.\d+\."
        uses: list[Any] = [
            (block + r"attention\.[qkv]_proj\.weight", 1),
            (block + r"(attention\.o_proj|mlp\.fc2)\.(weight|bias)", 0),
            (block + r"mlp\.fc1\.weight", 1),
            (block + r"layernorm_(before|after)\.bias", 0),
        ]
        scales: list[Any] = [(block + r"layernorm_(before|after)\.weight", 0)]
        if s == 0:
            uses += [
                (r"swin\.embeddings\.patch_embeddings\.projection\.(weight|bias)", 0),
                (r"swin\.embeddings\.norm\.bias", 0),
            ]
            scales.append((r"swin\.embeddings\.norm\.weight", 0))
        else:
            uses.append((rf"swin\.encoder\.layers\.{s - 1}\.downsample\.reduction\.weight", 0))
        if s < stages - 1:
            uses += [
                (stage + r"downsample\.reduction\.weight", 1, 4),
                (stage + r"downsample\.norm\.bias", 0, 4),
            ]
            scales.append((stage + r"downsample\.norm\.weight", 0, 4))
        else:
            uses += [(r"swin\.layernorm\.bias", 0), (r"classifier\.weight", 1)]
            scales.append((r"swin\.layernorm\.weight", 0))
        streams.append(Stream(tuple(uses), tuple(scales), centered=True))
        for b in range(cfg.depths[s]):
            pre = f"swin.encoder.layers.{s}.blocks.{b}."
            heads = cfg.num_heads[s]
            table = pre + "attention.relative_position_bias.relative_position_bias_table"
            atts.append(
                attention(
                    pre + "attention.",
                    _Heads(heads, dim),
                    QK("full"),
                    bias=True,
                    per_head=(Block(table, 1, torch.arange(heads).view(-1, 1)),),
                )
            )
            units.append(
                mlp([pre + "mlp.fc1"], pre + "mlp.fc2", int(cfg.mlp_ratio * dim), bias=True)
            )
    return Layout(tuple(streams), tuple(units), (), tuple(atts))


class _Heads:
    def __init__(self, heads: int, hidden: int) -> None:
        self.num_attention_heads, self.hidden_size = heads, hidden


@layout("convnext")
def _convnext(cfg: Any) -> Layout:
    # a stream per stage: the stem (or the downsampling convolution) writes it, each
    # block's depthwise convolution acts on it channel by channel, its channels-last
    # LayerNorm and layer scale act on it; pwconv1 -> pwconv2 units between
    streams, units = [], []
    for s, dim in enumerate(cfg.hidden_sizes):
        stage = rf"convnext\.encoder\.stages\.{s}\."
        lay = stage + r"layers\.\d+\."
        uses: list[Any] = [
            (lay + r"dwconv\.(weight|bias)", 0),
            (lay + r"(layer_scale_parameter|layernorm\.bias|pwconv2\.(weight|bias))", 0),
            (lay + r"pwconv1\.weight", 1),
        ]
        scales: list[Any] = [(lay + r"layernorm\.weight", 0)]
        if s == 0:
            uses += [
                (r"convnext\.embeddings\.patch_embeddings\.(weight|bias)", 0),
                (r"convnext\.embeddings\.layernorm\.bias", 0),
            ]
            scales.append((r"convnext\.embeddings\.layernorm\.weight", 0))
        else:
            uses.append((stage + r"downsampling_layer\.1\.(weight|bias)", 0))
        if s + 1 < len(cfg.hidden_sizes):
            after = rf"convnext\.encoder\.stages\.{s + 1}\.downsampling_layer\."
            uses += [(after + r"0\.bias", 0), (after + r"1\.weight", 1)]
            scales.append((after + r"0\.weight", 0))
        else:
            uses += [(r"convnext\.layernorm\.bias", 0), (r"classifier\.weight", 1)]
            scales.append((r"convnext\.layernorm\.weight", 0))
        streams.append(Stream(tuple(uses), tuple(scales), centered=True))
        for b in range(cfg.depths[s]):
            pre = f"convnext.encoder.stages.{s}.layers.{b}."
            units.append(mlp([pre + "pwconv1"], pre + "pwconv2", 4 * dim, bias=True))
    return Layout(tuple(streams), tuple(units))


def _conv_bn(name: str, index: torch.Tensor) -> tuple[Block, ...]:
    """Output channels of a convolution and its BatchNorm (scale, shift, running stats)."""
    norm = name + ".normalization."
    return (
        Block(name + ".convolution.weight", 0, index),
        *(Block(norm + p, 0, index) for p in ("weight", "bias", "running_mean", "running_var")),
    )


@layout("resnet")
def _resnet(cfg: Any) -> Layout:
    # bottleneck blocks (1x1 -> 3x3 -> 1x1 convolutions, each with BatchNorm; ReLU
    # between, a quarter of the width inside): the two inner widths are units. The
    # stream of stage 0 is the stem's output (its first block has no shortcut: the tiny
    # config keeps the width); each later stage's is written by its first block's
    # shortcut and every block's last convolution. The tiny config: one block a stage.
    assert cfg.embedding_size == cfg.hidden_sizes[0] and set(cfg.depths) == {1}
    conv_bn = r"(convolution\.weight|normalization\.(weight|bias|running_mean|running_var))"
    streams, units = [], []
    writer = rf"resnet\.embedder\.embedder\.{conv_bn}"
    for s, dim in enumerate(cfg.hidden_sizes):
        block = rf"resnet\.encoder\.stages\.{s}\.layers\.0\."
        uses: list[Any] = [(writer, 0), (block + r"layer\.2\." + conv_bn, 0)]
        if s == 0:
            uses.append((block + r"layer\.0\.convolution\.weight", 1))
        if s + 1 < len(cfg.hidden_sizes):
            nxt = rf"resnet\.encoder\.stages\.{s + 1}\.layers\.0\."
            uses.append((nxt + r"(shortcut|layer\.0)\.convolution\.weight", 1))
            writer = nxt + r"shortcut\." + conv_bn
        else:
            uses.append((r"classifier\.1\.weight", 1))
        streams.append(Stream(tuple(uses)))
        pre = f"resnet.encoder.stages.{s}.layers.0.layer."
        inner = torch.arange(dim // 4)
        for j in (0, 1):
            units.append(
                Units(
                    (
                        *_conv_bn(pre + str(j), inner),
                        Block(pre + f"{j + 1}.convolution.weight", 1, inner),
                    )
                )
            )
    return Layout(tuple(streams), tuple(units))
