"""Layouts of Llama-like decoders, read from each family's ``modeling_*.py``.

All share Llama's names (``model.layers.{i}.self_attn.{q,k,v,o}_proj``, ``mlp.*``,
``model.norm``, ``lm_head``) and its grouped-query attention (``repeat_kv``: key/value
head ``g`` serves query heads ``g * per_group ...``); they differ in their norms, MLP,
rotary layout and query/key norms, as each function says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .engine import QK, Attention, Block, Layout, Norm, Stream
from .layouts import attention, kv_index, layout, linear, mlp, query_index, reader, rotary

_L = r"model\.layers\.\d+\."
Readers = tuple[tuple[str, int], ...]


def _gated(pre: str) -> Readers:
    return ((pre + "mlp.gate_proj.weight", 1), (pre + "mlp.up_proj.weight", 1))


@dataclass(frozen=True)
class Decoder:
    """How a Llama-like family differs from Llama.

    ``mlp_in``/``mlp_out``: the MLP's input layers (rows ``[gate | up]`` when one fused
    layer is given with ``fused_mlp``) and output layer; ``mlp_readers``: the
    parameters reading the second norm (``(name, axis)``, given the layer prefix);
    ``layer_norm``: LayerNorms (centred rotations), with a shift when ``norm_bias``;
    ``offset``: a norm scale read as ``offset + w``; ``parallel``: attention and MLP
    read one norm; ``rotates``: the stream admits rotations once norms are folded
    (False where a norm's output is summed into the stream); ``extra_uses``: more
    stream parameters; ``attn_readers``: what reads the first norm, if not q/k/v."""

    mlp_in: tuple[str, ...] = ("gate_proj", "up_proj")
    mlp_out: str = "down_proj"
    mlp_bias: bool = False
    fused_mlp: bool = False
    mlp_readers: Callable[[str], Readers] = _gated
    attn_bias: bool = False
    fused_qkv: bool = False
    layer_norm: bool = False
    norm_bias: bool = False
    offset: float = 0.0
    parallel: bool = False
    rotates: bool = True
    extra_uses: tuple[tuple[str, int], ...] = field(default=())
    attn_readers: Callable[[str], Readers] | None = None


def decoder_stream(cfg: Any, how: Decoder) -> Stream:
    """The embedding and the head; every projection reading (columns) or writing (rows,
    biases) the stream; every norm's scale (and shift) and, where the stream rotates,
    each norm with the layers reading it."""
    mlp_in = "|".join(how.mlp_in)
    uses = (
        (r"(model\.embed_tokens|lm_head)\.weight", 1),
        (_L + r"self_attn\.([qkv]|qkv)_proj\.weight", 1),
        (_L + r"self_attn\.o_proj\.(weight|bias)", 0),
        (_L + rf"mlp\.({mlp_in})\.weight", 1),
        (_L + rf"mlp\.{how.mlp_out}\.(weight|bias)", 0),
        *how.extra_uses,
    )
    names = (_L + r"\w*(layernorm|norm)", r"model\.norm")
    scales = tuple((rf"{n}\.weight", 0) for n in names)
    shifts = tuple((rf"{n}\.bias", 0) for n in names) if how.norm_bias else ()
    norms = _norms(cfg, how) if how.rotates else ()
    return Stream(uses + shifts, scales, how.layer_norm, norms)


def _norms(cfg: Any, how: Decoder) -> tuple[Norm, ...]:
    def norm(name: str, readers: Readers) -> Norm:
        shift = name + ".bias" if how.norm_bias else None
        return Norm(name + ".weight", readers, shift, how.offset)

    found = []
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        names = ("qkv_proj",) if how.fused_qkv else ("q_proj", "k_proj", "v_proj")
        attn = tuple((f"{pre}self_attn.{n}.weight", 1) for n in names)
        if how.attn_readers is not None:
            attn = how.attn_readers(pre)
        if how.parallel:
            found.append(norm(pre + "input_layernorm", attn + how.mlp_readers(pre)))
        else:
            found.append(norm(pre + "input_layernorm", attn))
            found.append(norm(pre + "post_attention_layernorm", how.mlp_readers(pre)))
    return (*found, norm("model.norm", (("lm_head.weight", 1),)))


def decoder(cfg: Any, qk: QK, how: Decoder = Decoder(), **att: Any) -> Layout:
    """A Llama-like decoder's layout (see :class:`Decoder`)."""
    inner, units, atts = cfg.intermediate_size, [], []
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        ins = [pre + "mlp." + n for n in how.mlp_in]
        offsets = (0, inner) if how.fused_mlp else (0,)
        out = pre + "mlp." + how.mlp_out
        units.append(mlp(ins, out, inner, bias=how.mlp_bias, offsets=offsets))
        if how.fused_qkv:
            atts.append(_fused_qkv(cfg, pre, qk))
        else:
            atts.append(attention(pre + "self_attn.", cfg, qk, bias=how.attn_bias, **att))
    return Layout((decoder_stream(cfg, how),), tuple(units), (), tuple(atts))


def _fused_qkv(cfg: Any, pre: str, qk: QK) -> Attention:
    """Phi-3's qkv_proj: rows ``[queries | keys | values]``."""
    heads, groups = cfg.num_attention_heads, cfg.num_key_value_heads
    d, qkv = cfg.hidden_size // heads, pre + "self_attn.qkv_proj"
    return Attention(
        q=linear(qkv, query_index(heads, d, groups), bias=False),
        k=linear(qkv, kv_index(groups, d, heads * d), bias=False),
        v=linear(qkv, kv_index(groups, d, (heads + groups) * d), bias=False),
        o=reader(pre + "self_attn.o_proj", query_index(heads, d, groups)),
        qk=qk,
    )


@layout("llama", "mistral", "granite")
def _llama(cfg: Any) -> Layout:  # Granite: Llama with scalar multipliers
    return decoder(cfg, rotary(cfg))


@layout("qwen2")
def _qwen2(cfg: Any) -> Layout:  # biases on the query, key and value projections
    return decoder(cfg, rotary(cfg), Decoder(attn_bias=True))


@layout("gemma")
def _gemma(cfg: Any) -> Layout:  # RMSNorm scales 1 + w; the head tied to the embedding
    return decoder(cfg, rotary(cfg), Decoder(offset=1.0))


@layout("gemma2")
def _gemma2(cfg: Any) -> Layout:
    # norms before and after each block: a norm's output is summed into the stream, so
    # it admits no rotation; attention logits soft-capped (a function of each score)
    return decoder(cfg, rotary(cfg), Decoder(offset=1.0, rotates=False))


@layout("smollm3")
def _smollm3(cfg: Any) -> Layout:  # no rotary positions where no_rope_layers[i] is 0 (NoPE)
    base = decoder(cfg, rotary(cfg))
    atts = tuple(
        a if cfg.no_rope_layers[i] else replace(a, qk=QK("full"))
        for i, a in enumerate(base.attention)
    )
    return replace(base, attention=atts)


def qk_norm_scales(cfg: Any, i: int, per_head: bool) -> dict[str, tuple[Block, ...]]:
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


def _qk_normed(cfg: Any, how: Decoder, *, per_head: bool) -> Layout:
    # a map of a head's query/key features must commute with the query/key norm (one
    # scale per feature): each rotary plane turned by 0 or pi
    base = decoder(cfg, QK("plane_signs", rotary(cfg).rotary_dim), how)
    atts = tuple(
        replace(a, **qk_norm_scales(cfg, i, per_head)) for i, a in enumerate(base.attention)
    )
    return replace(base, attention=atts)


@layout("qwen3")
def _qwen3(cfg: Any) -> Layout:  # q_norm, k_norm: RMSNorm over each head's dims
    return _qk_normed(cfg, Decoder(), per_head=True)


@layout("gemma3")
def _gemma3(cfg: Any) -> Layout:  # Qwen3's qk-norm, Gemma2's norms after each block
    return _qk_normed(cfg, Decoder(offset=1.0, rotates=False), per_head=True)


@layout("olmo2")
def _olmo2(cfg: Any) -> Layout:
    # q_norm, k_norm: RMSNorm over the whole projection; norms after each block only
    return _qk_normed(cfg, Decoder(rotates=False), per_head=False)


@layout("cohere")
def _cohere(cfg: Any) -> Layout:
    # interleaved rotary (rotate_half on x[..., ::2], x[..., 1::2]); LayerNorm without
    # bias; attention and MLP in parallel from input_layernorm
    return decoder(cfg, rotary(cfg, "interleaved"), Decoder(layer_norm=True, parallel=True))


@layout("stablelm")
def _stablelm(cfg: Any) -> Layout:  # partial rotary (half-split), LayerNorms with bias
    return decoder(cfg, rotary(cfg), Decoder(layer_norm=True, norm_bias=True))


@layout("phi3")
def _phi3(cfg: Any) -> Layout:  # qkv_proj rows [q | k | v]; gate_up_proj rows [gate | up]
    def readers(pre: str) -> Readers:
        return ((pre + "mlp.gate_up_proj.weight", 1),)

    how = Decoder(mlp_in=("gate_up_proj",), fused_mlp=True, fused_qkv=True, mlp_readers=readers)
    return decoder(cfg, rotary(cfg), how)


@layout("starcoder2")
def _starcoder2(cfg: Any) -> Layout:  # c_fc -> c_proj with biases; LayerNorms with bias
    def readers(pre: str) -> Readers:
        return ((pre + "mlp.c_fc.weight", 1),)

    how = Decoder(mlp_in=("c_fc",), mlp_out="c_proj", mlp_bias=True, attn_bias=True,
                  layer_norm=True, norm_bias=True, mlp_readers=readers)  # fmt: skip
    return decoder(cfg, rotary(cfg), how)


@layout("nemotron")
def _nemotron(cfg: Any) -> Layout:  # up_proj -> relu^2 -> down_proj; LayerNorm1P (1 + w)
    def readers(pre: str) -> Readers:
        return ((pre + "mlp.up_proj.weight", 1),)

    how = Decoder(mlp_in=("up_proj",), layer_norm=True, norm_bias=True, offset=1.0,
                  mlp_readers=readers)  # fmt: skip
    return decoder(cfg, rotary(cfg), how)
