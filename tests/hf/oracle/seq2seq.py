"""Layouts of encoder-decoders, read from each family's ``modeling_*.py``."""

from __future__ import annotations

from typing import Any

import torch

from .engine import QK, Attention, Block, Layout, Stream, Units
from .layouts import attention, layout, mlp


class _Heads:
    """Head counts under Llama's attribute names."""

    def __init__(self, heads: int, hidden: int, head_dim: int | None = None) -> None:
        self.num_attention_heads, self.hidden_size = heads, hidden
        self.head_dim = head_dim


@layout("t5")
def _t5(cfg: Any) -> Layout:
    # one stream for encoder and decoder (their embeddings are `shared`); RMSNorm-like
    # T5LayerNorm before each block; the relative position bias is computed by the first
    # layer's self-attention and added in every layer: its columns (one per head) tie the
    # self-attention heads of all encoder layers (and of all decoder layers) to one
    # permutation; cross-attention has no position bias, so each layer's heads are free
    block = r"(en|de)coder\.block\.\d+\.layer\.\d+\."
    stream = Stream(
        (
            (r"(shared|(en|de)coder\.embed_tokens|lm_head)\.weight", 1),
            (block + r"(SelfAttention|EncDecAttention)\.[qkv]\.weight", 1),
            (block + r"(SelfAttention|EncDecAttention)\.o\.weight", 0),
            (block + r"DenseReluDense\.wi\.weight", 1),
            (block + r"DenseReluDense\.wo\.weight", 0),
        ),
        ((block + r"layer_norm\.weight", 0), (r"(en|de)coder\.final_layer_norm\.weight", 0)),
    )
    heads = _Heads(cfg.num_heads, cfg.d_model, cfg.d_kv)
    per_head = torch.arange(cfg.num_heads).view(cfg.num_heads, 1)
    atts, units = [], []
    for side, layers, ffn in (
        ("encoder", cfg.num_layers, 1),
        ("decoder", cfg.num_decoder_layers, 2),
    ):
        for i in range(layers):
            pre = f"{side}.block.{i}.layer."
            table = pre + "0.SelfAttention.relative_attention_bias.weight"
            atts.append(
                attention(
                    pre + "0.SelfAttention.",
                    heads,
                    QK("full"),
                    names=("q", "k", "v", "o"),
                    tie=side,
                    per_head=(Block(table, 1, per_head),) if i == 0 else (),
                )
            )
            if side == "decoder":
                atts.append(
                    attention(
                        pre + "1.EncDecAttention.", heads, QK("full"), names=("q", "k", "v", "o")
                    )
                )
            ff = f"{pre}{ffn}.DenseReluDense."
            units.append(mlp([ff + "wi"], ff + "wo", cfg.d_ff, bias=False))
    return Layout((stream,), tuple(units), (), tuple(atts))


_BART_ATT = ("q_proj", "k_proj", "v_proj", "out_proj")


def _bart_like_blocks(
    prefix: str, encoder_layers: int, decoder_layers: int, heads: _Heads, ffn: int
) -> tuple[tuple[Units, ...], tuple[Attention, ...]]:
    """BART's and Whisper's layers: self-attention (and cross-attention in the decoder)
    with out_proj, fc1 -> fc2; no position bias, so every layer's heads are free."""
    units, atts = [], []
    for side, layers in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        for i in range(layers):
            pre = f"{prefix}{side}.layers.{i}."
            kinds = ("self_attn", "encoder_attn") if side == "decoder" else ("self_attn",)
            for kind in kinds:
                att = attention(pre + kind + ".", heads, QK("full"), bias=True, names=_BART_ATT)
                atts.append(att)
            units.append(mlp([pre + "fc1"], pre + "fc2", ffn, bias=True))
    return tuple(units), tuple(atts)


def _without_key_bias(att: Attention) -> Attention:
    """Whisper's k_proj has no bias."""
    return Attention(**{**att.__dict__, "k": tuple(b for b in att.k if b.param.endswith("weight"))})


@layout("bart")
def _bart(cfg: Any) -> Layout:
    # post-LayerNorm; learned positions and layernorm_embedding on each side; one stream
    # for both sides (their token embeddings are `shared`, as is the head)
    layer = r"model\.(en|de)coder\.layers\.\d+\."
    norms = (layer + r"\w*layer_norm", r"model\.(en|de)coder\.layernorm_embedding")
    stream = Stream(
        (
            (r"(model\.shared|model\.(en|de)coder\.embed_(tokens|positions)|lm_head)\.weight", 1),
            (layer + r"(self_attn|encoder_attn)\.[qkv]_proj\.weight", 1),
            (layer + r"((self_attn|encoder_attn)\.out_proj|fc2)\.(weight|bias)", 0),
            (layer + r"fc1\.weight", 1),
            *((rf"{n}\.bias", 0) for n in norms),
        ),
        tuple((rf"{n}\.weight", 0) for n in norms),
        centered=True,
    )
    units, atts = _bart_like_blocks(
        "model.",
        cfg.encoder_layers,
        cfg.decoder_layers,
        _Heads(cfg.encoder_attention_heads, cfg.d_model),
        cfg.encoder_ffn_dim,
    )
    return Layout((stream,), units, (), atts)


@layout("whisper")
def _whisper(cfg: Any) -> Layout:
    # two streams: the encoder's (written by conv2 after a GELU, and the positions) and
    # the decoder's (token and position embeddings, the head proj_out tied to them);
    # cross-attention keys and values read the encoder's; conv1's channels are units
    # (a GELU between conv1 and conv2); pre-LayerNorm on both sides
    def side(name: str) -> tuple[tuple[str, int], ...]:
        layer = rf"model\.{name}\.layers\.\d+\."
        return (
            (rf"model\.{name}\.embed_positions\.weight", 1),
            (layer + r"self_attn\.[qkv]_proj\.weight", 1),
            (layer + r"(self_attn\.out_proj|encoder_attn\.out_proj|fc2)\.(weight|bias)", 0),
            (layer + r"fc1\.weight", 1),
            (layer + r"\w*layer_norm\.bias", 0),
            (rf"model\.{name}\.layer_norm\.bias", 0),
        )

    def scales(name: str) -> tuple[tuple[str, int], ...]:
        return ((rf"model\.{name}\.(layers\.\d+\.\w*)?layer_norm\.weight", 0),)

    cross = r"model\.decoder\.layers\.\d+\.encoder_attn\."
    encoder = Stream(
        (
            *side("encoder"),
            (r"model\.encoder\.conv2\.(weight|bias)", 0),
            (cross + r"[kv]_proj\.weight", 1),
        ),
        scales("encoder"),
        centered=True,
    )
    decoder = Stream(
        (
            *side("decoder"),
            (r"(model\.decoder\.embed_tokens|proj_out)\.weight", 1),
            (cross + r"q_proj\.weight", 1),
        ),
        scales("decoder"),
        centered=True,
    )
    units, atts = _bart_like_blocks(
        "model.",
        cfg.encoder_layers,
        cfg.decoder_layers,
        _Heads(cfg.encoder_attention_heads, cfg.d_model),
        cfg.encoder_ffn_dim,
    )
    conv1 = torch.arange(cfg.d_model)
    frontend = Units(
        (
            Block("model.encoder.conv1.weight", 0, conv1),
            Block("model.encoder.conv1.bias", 0, conv1),
            Block("model.encoder.conv2.weight", 1, conv1),
        )
    )
    return Layout(
        (encoder, decoder), (frontend, *units), (), tuple(_without_key_bias(a) for a in atts)
    )
