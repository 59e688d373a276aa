"""Layouts of decoder-only language models, read from each family's ``modeling_*.py``."""

from __future__ import annotations

from typing import Any

import torch

from .engine import QK, Attention, Block, Layout, Stream, Units
from .layouts import (
    attention,
    kv_index,
    layout,
    linear,
    mlp,
    query_index,
    reader,
    rotary,
)

_L = r"model\.layers\.\d+\."


def llama_stream(
    *,
    norm_bias: bool = False,
    centered: bool = False,
    mlp_in: str = r"(gate|up)_proj",
    mlp_out: str = "down_proj",
    extra: tuple[tuple[str, int], ...] = (),
) -> Stream:
    """Llama's names: the embedding and the untied head; every projection reading
    (columns) or writing (rows, biases) the stream; every norm's scale (and shift)."""
    uses = (
        (r"model\.embed_tokens\.weight", 1),
        (r"lm_head\.weight", 1),
        (_L + r"self_attn\.[qkv]_proj\.weight", 1),
        (_L + r"self_attn\.o_proj\.(weight|bias)", 0),
        (_L + rf"mlp\.{mlp_in}\.weight", 1),
        (_L + rf"mlp\.{mlp_out}\.(weight|bias)", 0),
        *extra,
    )
    norms = (_L + r"\w*(layernorm|norm)", r"model\.norm")
    scales = tuple((rf"{n}\.weight", 0) for n in norms)
    shifts = tuple((rf"{n}\.bias", 0) for n in norms) if norm_bias else ()
    return Stream(uses + shifts, scales, centered)


def _layers(cfg: Any) -> range:
    return range(cfg.num_hidden_layers)


def llama_like(
    cfg: Any, qk: QK, *, bias: bool = False, stream: Stream | None = None, **att: Any
) -> Layout:
    """Llama: grouped-query attention, a gated MLP (``gate_proj``, ``up_proj`` ->
    ``down_proj``), RMSNorms before each block."""
    pre = "model.layers.{}."
    return Layout(
        streams=(stream or llama_stream(),),
        units=tuple(
            mlp(
                [pre.format(i) + "mlp.gate_proj", pre.format(i) + "mlp.up_proj"],
                pre.format(i) + "mlp.down_proj",
                cfg.intermediate_size,
                bias=False,
            )
            for i in _layers(cfg)
        ),
        attention=tuple(
            attention(pre.format(i) + "self_attn.", cfg, qk, bias=bias, **att) for i in _layers(cfg)
        ),
    )


@layout("llama", "mistral", "granite")
def _llama(cfg: Any) -> Layout:
    return llama_like(cfg, rotary(cfg))


@layout("smollm3")
def _smollm3(cfg: Any) -> Layout:  # no rotary positions where no_rope_layers[i] is 0 (NoPE)
    base = llama_like(cfg, rotary(cfg))
    atts = tuple(
        a if cfg.no_rope_layers[i] else Attention(**{**a.__dict__, "qk": QK("full")})
        for i, a in enumerate(base.attention)
    )
    return Layout(base.streams, base.units, base.experts, atts)


@layout("qwen2")
def _qwen2(cfg: Any) -> Layout:  # biases on the query, key and value projections
    return llama_like(cfg, rotary(cfg), bias=True)


@layout("gemma")
def _gemma(cfg: Any) -> Layout:  # RMSNorm scales 1 + w: permuted like any scale
    return llama_like(cfg, rotary(cfg))


@layout("gemma2")
def _gemma2(cfg: Any) -> Layout:  # norms before and after each block: scales all
    return llama_like(cfg, rotary(cfg))


def _qk_norms(cfg: Any, i: int, per_head: bool) -> dict[str, tuple[Block, ...]]:
    """Norm scales over the queries and keys: one per head dim shared by every head
    (Qwen3: nothing to move), or over the whole projection (OLMo2: moves with heads)."""
    if per_head:
        return {}
    heads, groups = cfg.num_attention_heads, cfg.num_key_value_heads
    d = cfg.hidden_size // heads
    pre = f"model.layers.{i}.self_attn."
    return {
        "q_scales": (Block(pre + "q_norm.weight", 0, query_index(heads, d, groups)),),
        "k_scales": (Block(pre + "k_norm.weight", 0, kv_index(groups, d)),),
    }


def _qk_normed(cfg: Any, *, per_head: bool, bias: bool = False) -> Layout:
    base = llama_like(cfg, QK("plane_signs", rotary(cfg).rotary_dim), bias=bias)
    atts = tuple(
        Attention(**{**a.__dict__, **_qk_norms(cfg, i, per_head)})
        for i, a in enumerate(base.attention)
    )
    return Layout(base.streams, base.units, base.experts, atts)


@layout("qwen3", "gemma3")
def _qwen3(cfg: Any) -> Layout:
    # q_norm, k_norm: RMSNorm over each head's dims, one scale shared by all heads; a
    # map of the query/key features must commute with it: each rotary plane negated
    return _qk_normed(cfg, per_head=True)


@layout("olmo2")
def _olmo2(cfg: Any) -> Layout:
    # q_norm, k_norm: RMSNorm over the whole projection, after it; norms after each block
    return _qk_normed(cfg, per_head=False)


@layout("cohere")
def _cohere(cfg: Any) -> Layout:
    # interleaved rotary (rotate_half on x[..., ::2], x[..., 1::2]); LayerNorm without
    # bias; attention and MLP in parallel from one norm
    return llama_like(cfg, rotary(cfg, "interleaved"), stream=llama_stream(centered=True))


@layout("stablelm")
def _stablelm(cfg: Any) -> Layout:  # partial rotary (half-split), LayerNorms with bias
    return llama_like(cfg, rotary(cfg), stream=llama_stream(norm_bias=True, centered=True))


@layout("phi3")
def _phi3(cfg: Any) -> Layout:
    # qkv_proj rows: [queries | keys | values]; gate_up_proj rows: [gate | up]
    heads, groups = cfg.num_attention_heads, cfg.num_key_value_heads
    d, inner = cfg.hidden_size // heads, cfg.intermediate_size
    qkv_in = r"self_attn\.qkv_proj"
    stream = llama_stream(mlp_in="gate_up_proj", extra=((_L + qkv_in + r"\.weight", 1),))
    units, atts = [], []
    for i in _layers(cfg):
        pre = f"model.layers.{i}."
        units.append(
            mlp(
                [pre + "mlp.gate_up_proj"],
                pre + "mlp.down_proj",
                inner,
                bias=False,
                offsets=(0, inner),
            )
        )
        qkv = pre + "self_attn.qkv_proj"
        atts.append(
            Attention(
                q=linear(qkv, query_index(heads, d, groups), bias=False),
                k=linear(qkv, kv_index(groups, d, heads * d), bias=False),
                v=linear(qkv, kv_index(groups, d, (heads + groups) * d), bias=False),
                o=reader(pre + "self_attn.o_proj", query_index(heads, d, groups)),
                qk=rotary(cfg),
            )
        )
    return Layout((stream,), tuple(units), (), tuple(atts))


@layout("starcoder2")
def _starcoder2(cfg: Any) -> Layout:  # c_fc -> c_proj with biases; LayerNorms with bias
    stream = llama_stream(norm_bias=True, centered=True, mlp_in="c_fc", mlp_out="c_proj")
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp(
                [f"model.layers.{i}.mlp.c_fc"],
                f"model.layers.{i}.mlp.c_proj",
                cfg.intermediate_size,
                bias=True,
            )
            for i in _layers(cfg)
        ),
        attention=tuple(
            attention(f"model.layers.{i}.self_attn.", cfg, rotary(cfg), bias=True)
            for i in _layers(cfg)
        ),
    )


@layout("nemotron")
def _nemotron(cfg: Any) -> Layout:  # up_proj -> relu^2 -> down_proj; LayerNorm1P (1 + w)
    stream = llama_stream(norm_bias=True, centered=True, mlp_in="up_proj")
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp(
                [f"model.layers.{i}.mlp.up_proj"],
                f"model.layers.{i}.mlp.down_proj",
                cfg.intermediate_size,
                bias=False,
            )
            for i in _layers(cfg)
        ),
        attention=tuple(
            attention(f"model.layers.{i}.self_attn.", cfg, rotary(cfg)) for i in _layers(cfg)
        ),
    )


@layout("phi")
def _phi(cfg: Any) -> Layout:
    # q/k/v/dense with biases, partial rotary (half-split), fc1 -> fc2; one LayerNorm
    # feeds attention and MLP in parallel; the head has a bias
    stream = Stream(
        (
            (r"model\.embed_tokens\.weight", 1),
            (r"lm_head\.weight", 1),
            (_L + r"self_attn\.[qkv]_proj\.weight", 1),
            (_L + r"self_attn\.dense\.(weight|bias)", 0),
            (_L + r"mlp\.fc1\.weight", 1),
            (_L + r"mlp\.fc2\.(weight|bias)", 0),
            (_L + r"input_layernorm\.bias", 0),
            (r"model\.final_layernorm\.bias", 0),
        ),
        ((_L + r"input_layernorm\.weight", 0), (r"model\.final_layernorm\.weight", 0)),
        centered=True,
    )
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp(
                [f"model.layers.{i}.mlp.fc1"],
                f"model.layers.{i}.mlp.fc2",
                cfg.intermediate_size,
                bias=True,
            )
            for i in _layers(cfg)
        ),
        attention=tuple(
            attention(
                f"model.layers.{i}.self_attn.",
                cfg,
                rotary(cfg),
                bias=True,
                names=("q_proj", "k_proj", "v_proj", "dense"),
            )
            for i in _layers(cfg)
        ),
    )


def fused_per_head(qkv: str, out: str, heads: int, d: int, qk: QK, **kw: Any) -> Attention:
    """A fused projection viewed ``(heads, 3, head_dim)`` (GPT-NeoX, BLOOM)."""
    first = (torch.arange(heads) * 3 * d)[:, None] + torch.arange(d)  # (heads, d)
    return Attention(
        q=linear(qkv, first[:, None], bias=True),
        k=linear(qkv, first + d, bias=True),
        v=linear(qkv, first + 2 * d, bias=True),
        o=reader(out, query_index(heads, d, heads)),
        qk=qk,
        **kw,
    )


def _gpt_stream(
    pre: str,
    layers: str,
    mlp_in: str,
    mlp_out: str,
    attn: str,
    norms: str,
    final: str,
    extra: tuple[tuple[str, int], ...] = (),
) -> Stream:
    """A LayerNorm stream under ``pre``: the token embedding (and ``extra``), projections
    reading and writing it, every norm; the head reads it."""
    layer = rf"{pre}\.{layers}\.\d+\."
    return Stream(
        (
            *extra,
            (r"lm_head\.weight", 1),
            (layer + rf"{attn[0]}\.weight", 1),
            (layer + rf"{attn[1]}\.(weight|bias)", 0),
            (layer + rf"{mlp_in}\.weight", 1),
            (layer + rf"{mlp_out}\.(weight|bias)", 0),
            (layer + rf"{norms}\.bias", 0),
            (rf"{pre}\.{final}\.bias", 0),
        ),
        ((layer + rf"{norms}\.weight", 0), (rf"{pre}\.{final}\.weight", 0)),
        centered=True,
    )


@layout("gpt_neox")
def _gpt_neox(cfg: Any) -> Layout:
    # query_key_value viewed (heads, 3 * head_dim) and chunked; partial rotary (half)
    heads = cfg.num_attention_heads
    d = cfg.hidden_size // heads
    pre = "gpt_neox.layers.{}."
    stream = _gpt_stream(
        "gpt_neox",
        "layers",
        r"mlp\.dense_h_to_4h",
        r"mlp\.dense_4h_to_h",
        (r"attention\.query_key_value", r"attention\.dense"),
        r"\w+_layernorm",
        "final_layer_norm",
        extra=((r"gpt_neox\.embed_in\.weight", 1),),
    )
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp(
                [pre.format(i) + "mlp.dense_h_to_4h"],
                pre.format(i) + "mlp.dense_4h_to_h",
                cfg.intermediate_size,
                bias=True,
            )
            for i in _layers(cfg)
        ),
        attention=tuple(
            fused_per_head(
                pre.format(i) + "attention.query_key_value",
                pre.format(i) + "attention.dense",
                heads,
                d,
                rotary(cfg),
            )
            for i in _layers(cfg)
        ),
    )


@layout("bloom")
def _bloom(cfg: Any) -> Layout:
    # query_key_value viewed (heads, 3, head_dim); ALiBi: a slope per head fixes the
    # heads' order, but each head's value and query/key bases are free (no rotary)
    heads, d = cfg.n_head, cfg.hidden_size // cfg.n_head
    pre = "transformer.h.{}."
    stream = _gpt_stream(
        "transformer",
        "h",
        r"mlp\.dense_h_to_4h",
        r"mlp\.dense_4h_to_h",
        (r"self_attention\.query_key_value", r"self_attention\.dense"),
        r"\w+_layernorm",
        "ln_f",
        extra=(
            (r"transformer\.word_embeddings\.weight", 1),
            (r"transformer\.word_embeddings_layernorm\.bias", 0),
        ),
    )
    stream = Stream(
        stream.uses, (*stream.scales, (r"transformer\.word_embeddings_layernorm\.weight", 0))
    )
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp(
                [pre.format(i) + "mlp.dense_h_to_4h"],
                pre.format(i) + "mlp.dense_4h_to_h",
                4 * cfg.hidden_size,
                bias=True,
            )
            for i in range(cfg.n_layer)
        ),
        attention=tuple(
            fused_per_head(
                pre.format(i) + "self_attention.query_key_value",
                pre.format(i) + "self_attention.dense",
                heads,
                d,
                QK("full"),
                heads_move=False,
            )
            for i in range(cfg.n_layer)
        ),
    )


@layout("falcon")
def _falcon(cfg: Any) -> Layout:
    # multi-query: query_key_value viewed (heads + 2, head_dim): the query heads, then
    # the one key head and the one value head; no biases; attention and MLP in parallel
    heads = cfg.num_attention_heads
    d = cfg.hidden_size // heads
    pre = "transformer.h.{}."
    stream = _gpt_stream(
        "transformer",
        "h",
        r"mlp\.dense_h_to_4h",
        r"mlp\.dense_4h_to_h",
        (r"self_attention\.query_key_value", r"self_attention\.dense"),
        r"input_layernorm",
        "ln_f",
        extra=((r"transformer\.word_embeddings\.weight", 1),),
    )
    atts = []
    for i in range(cfg.num_hidden_layers):
        qkv = pre.format(i) + "self_attention.query_key_value"
        atts.append(
            Attention(
                q=linear(qkv, query_index(heads, d, 1), bias=False),
                k=linear(qkv, kv_index(1, d, heads * d), bias=False),
                v=linear(qkv, kv_index(1, d, (heads + 1) * d), bias=False),
                o=reader(pre.format(i) + "self_attention.dense", query_index(heads, d, 1)),
                qk=rotary(cfg),
            )
        )
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp(
                [pre.format(i) + "mlp.dense_h_to_4h"],
                pre.format(i) + "mlp.dense_4h_to_h",
                4 * cfg.hidden_size,
                bias=False,
            )
            for i in range(cfg.num_hidden_layers)
        ),
        attention=tuple(atts),
    )


@layout("gptj")
def _gptj(cfg: Any) -> Layout:
    # q/k/v/out_proj without biases; rotary on the first rotary_dim dims of each head,
    # interleaved (rotate_every_two); attention and MLP in parallel from ln_1
    d = cfg.n_embd // cfg.n_head
    pre = "transformer.h.{}."
    stream = _gpt_stream(
        "transformer",
        "h",
        r"mlp\.fc_in",
        r"mlp\.fc_out",
        (r"attn\.[qkv]_proj", r"attn\.out_proj"),
        r"ln_1",
        "ln_f",
        extra=((r"transformer\.wte\.weight", 1),),
    )
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp([pre.format(i) + "mlp.fc_in"], pre.format(i) + "mlp.fc_out", cfg.n_inner, bias=True)
            for i in range(cfg.n_layer)
        ),
        attention=tuple(
            attention(
                pre.format(i) + "attn.",
                cfg,
                QK("interleaved", cfg.rotary_dim),
                names=("q_proj", "k_proj", "v_proj", "out_proj"),
                head_dim=d,
            )
            for i in range(cfg.n_layer)
        ),
    )


@layout("gpt2")
def _gpt2(cfg: Any) -> Layout:
    # Conv1D layers (weight: in x out); c_attn's columns split into query, key, value;
    # learned positions (wpe) write the stream; the head is tied to wte
    heads, width = cfg.n_head, cfg.n_embd
    d = width // heads
    pre = "transformer.h.{}."
    stream = Stream(
        (
            (r"transformer\.w[tp]e\.weight", 1),
            (r"lm_head\.weight", 1),
            (r"transformer\.h\.\d+\.(attn\.c_attn|mlp\.c_fc)\.weight", 0),
            (r"transformer\.h\.\d+\.(attn|mlp)\.c_proj\.weight", 1),
            (r"transformer\.h\.\d+\.(attn|mlp)\.c_proj\.bias", 0),
            (r"transformer\.(h\.\d+\.ln_[12]|ln_f)\.bias", 0),
        ),
        ((r"transformer\.(h\.\d+\.ln_[12]|ln_f)\.weight", 0),),
        centered=True,
    )
    atts = []
    for i in range(cfg.n_layer):
        c_attn = pre.format(i) + "attn.c_attn"
        atts.append(
            Attention(
                q=linear(c_attn, query_index(heads, d, heads), bias=True, conv1d=True),
                k=linear(c_attn, kv_index(heads, d, width), bias=True, conv1d=True),
                v=linear(c_attn, kv_index(heads, d, 2 * width), bias=True, conv1d=True),
                o=reader(pre.format(i) + "attn.c_proj", query_index(heads, d, heads), conv1d=True),
                qk=QK("full"),
            )
        )
    units = []
    for i in range(cfg.n_layer):
        index = torch.arange(cfg.n_inner or 4 * width)
        c_fc, c_proj = pre.format(i) + "mlp.c_fc", pre.format(i) + "mlp.c_proj"
        units.append(
            Units(
                (*linear(c_fc, index, bias=True, conv1d=True), *reader(c_proj, index, conv1d=True))
            )
        )
    return Layout((stream,), tuple(units), (), tuple(atts))


@layout("opt")
def _opt(cfg: Any) -> Layout:
    # learned positions; LayerNorm before each block; fc1 -> fc2; the head is tied
    pre = "model.decoder.layers.{}."
    stream = _gpt_stream(
        "model.decoder",
        "layers",
        "fc1",
        "fc2",
        (r"self_attn\.[qkv]_proj", r"self_attn\.out_proj"),
        r"\w*layer_norm",
        "final_layer_norm",
        extra=((r"model\.decoder\.embed_(tokens|positions)\.weight", 1),),
    )
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp([pre.format(i) + "fc1"], pre.format(i) + "fc2", cfg.ffn_dim, bias=True)
            for i in _layers(cfg)
        ),
        attention=tuple(
            attention(
                pre.format(i) + "self_attn.",
                cfg,
                QK("full"),
                bias=True,
                names=("q_proj", "k_proj", "v_proj", "out_proj"),
            )
            for i in _layers(cfg)
        ),
    )


@layout("mpt")
def _mpt(cfg: Any) -> Layout:
    # Wqkv rows [queries | keys | values] (chunk(3)); ALiBi fixes the heads' order, not
    # their bases; LayerNorms without bias; up_proj -> down_proj; the head is tied to wte
    heads, width = cfg.n_heads, cfg.d_model
    d = width // heads
    stream = Stream(
        (
            (r"(transformer\.wte|lm_head)\.weight", 1),
            (r"transformer\.blocks\.\d+\.(attn\.Wqkv|ffn\.up_proj)\.weight", 1),
            (r"transformer\.blocks\.\d+\.(attn\.out_proj|ffn\.down_proj)\.weight", 0),
        ),
        ((r"transformer\.(blocks\.\d+\.norm_[12]|norm_f)\.weight", 0),),
        centered=True,
    )
    atts, units = [], []
    for i in range(cfg.n_layers):
        pre = f"transformer.blocks.{i}."
        qkv = pre + "attn.Wqkv"
        atts.append(
            Attention(
                q=linear(qkv, query_index(heads, d, heads), bias=False),
                k=linear(qkv, kv_index(heads, d, width), bias=False),
                v=linear(qkv, kv_index(heads, d, 2 * width), bias=False),
                o=reader(pre + "attn.out_proj", query_index(heads, d, heads)),
                qk=QK("full"),
                heads_move=False,
            )
        )
        units.append(
            mlp(
                [pre + "ffn.up_proj"],
                pre + "ffn.down_proj",
                cfg.expansion_ratio * width,
                bias=False,
            )
        )
    return Layout((stream,), tuple(units), (), tuple(atts))
