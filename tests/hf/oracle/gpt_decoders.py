"""Layouts of GPT-style decoders (LayerNorms, fused or differently named projections),
read from each family's ``modeling_*.py``."""

from __future__ import annotations

import re
from typing import Any

import torch

from .engine import QK, Attention, Layout, Norm, Stream, Units
from .layouts import attention, kv_index, layout, linear, mlp, query_index, reader, rotary


def gpt_stream(
    base: str,
    layers: int,
    *,
    embeddings: tuple[str, ...],
    attn: tuple[str, str],
    mlp_io: tuple[str, str],
    norms: dict[str, tuple[str, ...]],
    final: str,
    head: str = "lm_head",
    norm_bias: bool = True,
    conv1d: bool = False,
    rotates: bool = True,
) -> Stream:
    """A LayerNorm stream: the ``embeddings`` (a parameter each, features on the last
    axis) write it; per layer (``{base}.{i}.``) the attention's input layers
    (``attn[0]``, a regular expression) and the MLP's (``mlp_io[0]``) read it, ``attn[1]``
    and ``mlp_io[1]`` write it; ``norms``: each layer norm and the layers reading it;
    ``final`` norm and the ``head``. ``conv1d``: GPT-2's layers, weight (in, out)."""
    layer = re.escape(base + ".") + r"\d+\."
    read, write = (0, 1) if conv1d else (1, 0)
    names = "|".join(map(re.escape, norms))
    uses = (
        *((re.escape(e), -1) for e in embeddings),
        (re.escape(head) + r"\.weight", 1),
        (layer + rf"({attn[0]}|{mlp_io[0]})\.weight", read),
        (layer + rf"({attn[1]}|{mlp_io[1]})\.weight", write),
        (layer + rf"({attn[1]}|{mlp_io[1]})\.bias", 0),
    )
    norm_params = (layer + rf"({names})", re.escape(final))
    scales = tuple((rf"{n}\.weight", 0) for n in norm_params)
    shifts = tuple((rf"{n}\.bias", 0) for n in norm_params) if norm_bias else ()

    def norm(name: str, readers: tuple[tuple[str, int], ...]) -> Norm:
        return Norm(name + ".weight", readers, name + ".bias" if norm_bias else None)

    found = [
        norm(f"{base}.{i}.{n}", tuple((f"{base}.{i}.{r}.weight", read) for r in rs))
        for i in range(layers)
        for n, rs in norms.items()
    ]
    found.append(norm(final, ((head + ".weight", 1),)))
    return Stream(uses + shifts, scales, centered=True, norms=tuple(found) if rotates else ())


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


def _units(pre: str, layers: int, ins: str, out: str, n: int, bias: bool) -> tuple[Units, ...]:
    return tuple(mlp([f"{pre}.{i}.{ins}"], f"{pre}.{i}.{out}", n, bias=bias) for i in range(layers))


@layout("phi")
def _phi(cfg: Any) -> Layout:
    # q/k/v/dense with biases, partial rotary (half-split), fc1 -> fc2; one LayerNorm
    # feeds attention and MLP in parallel; the head has a bias
    n = cfg.num_hidden_layers
    stream = gpt_stream(
        "model.layers", n, embeddings=("model.embed_tokens.weight",),
        attn=(r"self_attn\.[qkv]_proj", r"self_attn\.dense"), mlp_io=(r"mlp\.fc1", r"mlp\.fc2"),
        norms={"input_layernorm": ("self_attn.q_proj", "self_attn.k_proj",
                                   "self_attn.v_proj", "mlp.fc1")},
        final="model.final_layernorm",
    )  # fmt: skip
    names = ("q_proj", "k_proj", "v_proj", "dense")
    return Layout(
        (stream,),
        _units("model.layers", n, "mlp.fc1", "mlp.fc2", cfg.intermediate_size, True),
        (),
        tuple(
            attention(f"model.layers.{i}.self_attn.", cfg, rotary(cfg), bias=True, names=names)
            for i in range(n)
        ),
    )


@layout("gpt_neox")
def _gpt_neox(cfg: Any) -> Layout:
    # query_key_value viewed (heads, 3 * head_dim) and chunked; partial rotary (half);
    # attention and MLP in parallel, each from its own norm
    heads, n = cfg.num_attention_heads, cfg.num_hidden_layers
    d = cfg.hidden_size // heads
    stream = gpt_stream(
        "gpt_neox.layers", n, embeddings=("gpt_neox.embed_in.weight",),
        attn=(r"attention\.query_key_value", r"attention\.dense"),
        mlp_io=(r"mlp\.dense_h_to_4h", r"mlp\.dense_4h_to_h"),
        norms={"input_layernorm": ("attention.query_key_value",),
               "post_attention_layernorm": ("mlp.dense_h_to_4h",)},
        final="gpt_neox.final_layer_norm",
    )  # fmt: skip
    pre = "gpt_neox.layers.{}.attention."
    return Layout(
        (stream,),
        _units("gpt_neox.layers", n, "mlp.dense_h_to_4h", "mlp.dense_4h_to_h",
               cfg.intermediate_size, True),
        (),
        tuple(
            fused_per_head(pre.format(i) + "query_key_value", pre.format(i) + "dense", heads, d,
                           rotary(cfg))
            for i in range(n)
        ),
    )  # fmt: skip


@layout("bloom")
def _bloom(cfg: Any) -> Layout:
    # query_key_value viewed (heads, 3, head_dim); ALiBi: a slope per head fixes the
    # heads' order, but each head's value and query/key bases are free (no rotary); the
    # embedding's LayerNorm output is the stream itself: no rotation
    heads, n = cfg.n_head, cfg.n_layer
    d = cfg.hidden_size // heads
    stream = gpt_stream(
        "transformer.h", n,
        embeddings=("transformer.word_embeddings.weight",
                    "transformer.word_embeddings_layernorm.bias"),
        attn=(r"self_attention\.query_key_value", r"self_attention\.dense"),
        mlp_io=(r"mlp\.dense_h_to_4h", r"mlp\.dense_4h_to_h"),
        norms={"input_layernorm": (), "post_attention_layernorm": ()}, final="transformer.ln_f",
        rotates=False,
    )  # fmt: skip
    scales = (*stream.scales, (r"transformer\.word_embeddings_layernorm\.weight", 0))
    pre = "transformer.h.{}.self_attention."
    return Layout(
        (Stream(stream.uses, scales, centered=True),),
        _units("transformer.h", n, "mlp.dense_h_to_4h", "mlp.dense_4h_to_h",
               4 * cfg.hidden_size, True),
        (),
        tuple(
            fused_per_head(pre.format(i) + "query_key_value", pre.format(i) + "dense", heads, d,
                           QK("full"), heads_move=False)
            for i in range(n)
        ),
    )  # fmt: skip


@layout("falcon")
def _falcon(cfg: Any) -> Layout:
    # multi-query: query_key_value viewed (heads + 2, head_dim): the query heads, then
    # the one key head and the one value head; no biases; attention and MLP in parallel
    heads, n = cfg.num_attention_heads, cfg.num_hidden_layers
    d = cfg.hidden_size // heads
    qkv, mlp_in = "self_attention.query_key_value", "mlp.dense_h_to_4h"
    stream = gpt_stream(
        "transformer.h", n, embeddings=("transformer.word_embeddings.weight",),
        attn=(r"self_attention\.query_key_value", r"self_attention\.dense"),
        mlp_io=(r"mlp\.dense_h_to_4h", r"mlp\.dense_4h_to_h"),
        norms={"input_layernorm": (qkv, mlp_in)}, final="transformer.ln_f",
    )  # fmt: skip
    atts = []
    for i in range(n):
        fused = f"transformer.h.{i}.{qkv}"
        atts.append(
            Attention(
                q=linear(fused, query_index(heads, d, 1), bias=False),
                k=linear(fused, kv_index(1, d, heads * d), bias=False),
                v=linear(fused, kv_index(1, d, (heads + 1) * d), bias=False),
                o=reader(f"transformer.h.{i}.self_attention.dense", query_index(heads, d, 1)),
                qk=rotary(cfg),
            )
        )
    units = _units("transformer.h", n, mlp_in, "mlp.dense_4h_to_h", 4 * cfg.hidden_size, False)
    return Layout((stream,), units, (), tuple(atts))


@layout("gptj")
def _gptj(cfg: Any) -> Layout:
    # q/k/v/out_proj without biases; rotary on the first rotary_dim dims of each head,
    # interleaved (rotate_every_two); attention and MLP in parallel from ln_1
    n, d = cfg.n_layer, cfg.n_embd // cfg.n_head
    stream = gpt_stream(
        "transformer.h", n, embeddings=("transformer.wte.weight",),
        attn=(r"attn\.[qkv]_proj", r"attn\.out_proj"), mlp_io=(r"mlp\.fc_in", r"mlp\.fc_out"),
        norms={"ln_1": ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.fc_in")},
        final="transformer.ln_f",
    )  # fmt: skip
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    qk = QK("interleaved", cfg.rotary_dim)
    return Layout(
        (stream,),
        _units("transformer.h", n, "mlp.fc_in", "mlp.fc_out", cfg.n_inner, True),
        (),
        tuple(
            attention(f"transformer.h.{i}.attn.", cfg, qk, names=names, head_dim=d)
            for i in range(n)
        ),
    )


@layout("gpt2")
def _gpt2(cfg: Any) -> Layout:
    # Conv1D layers (weight: in x out); c_attn's columns split into query, key, value;
    # learned positions (wpe) write the stream; the head is tied to wte
    heads, width, n = cfg.n_head, cfg.n_embd, cfg.n_layer
    d = width // heads
    stream = gpt_stream(
        "transformer.h", n, embeddings=("transformer.wte.weight", "transformer.wpe.weight"),
        attn=(r"attn\.c_attn", r"attn\.c_proj"), mlp_io=(r"mlp\.c_fc", r"mlp\.c_proj"),
        norms={"ln_1": ("attn.c_attn",), "ln_2": ("mlp.c_fc",)}, final="transformer.ln_f",
        conv1d=True,
    )  # fmt: skip
    atts, units = [], []
    for i in range(n):
        c_attn, c_proj = f"transformer.h.{i}.attn.c_attn", f"transformer.h.{i}.attn.c_proj"
        atts.append(
            Attention(
                q=linear(c_attn, query_index(heads, d, heads), bias=True, conv1d=True),
                k=linear(c_attn, kv_index(heads, d, width), bias=True, conv1d=True),
                v=linear(c_attn, kv_index(heads, d, 2 * width), bias=True, conv1d=True),
                o=reader(c_proj, query_index(heads, d, heads), conv1d=True),
                qk=QK("full"),
            )
        )
        index = torch.arange(cfg.n_inner or 4 * width)
        c_fc, c_out = f"transformer.h.{i}.mlp.c_fc", f"transformer.h.{i}.mlp.c_proj"
        ins = linear(c_fc, index, bias=True, conv1d=True)
        units.append(Units((*ins, *reader(c_out, index, conv1d=True))))
    return Layout((stream,), tuple(units), (), tuple(atts))


@layout("opt")
def _opt(cfg: Any) -> Layout:
    # learned positions; LayerNorm before each block (do_layer_norm_before); fc1 -> fc2;
    # the head is tied to the token embedding
    n = cfg.num_hidden_layers
    stream = gpt_stream(
        "model.decoder.layers", n,
        embeddings=("model.decoder.embed_tokens.weight", "model.decoder.embed_positions.weight"),
        attn=(r"self_attn\.[qkv]_proj", r"self_attn\.out_proj"), mlp_io=("fc1", "fc2"),
        norms={"self_attn_layer_norm": ("self_attn.q_proj", "self_attn.k_proj",
                                        "self_attn.v_proj"),
               "final_layer_norm": ("fc1",)},
        final="model.decoder.final_layer_norm",
    )  # fmt: skip
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    return Layout(
        (stream,),
        _units("model.decoder.layers", n, "fc1", "fc2", cfg.ffn_dim, True),
        (),
        tuple(
            attention(f"model.decoder.layers.{i}.self_attn.", cfg, QK("full"), bias=True,
                      names=names)
            for i in range(n)
        ),
    )  # fmt: skip


@layout("mpt")
def _mpt(cfg: Any) -> Layout:
    # Wqkv rows [queries | keys | values] (chunk(3)); ALiBi fixes the heads' order, not
    # their bases; LayerNorms without bias; up_proj -> down_proj; the head is tied to wte
    heads, width, n = cfg.n_heads, cfg.d_model, cfg.n_layers
    d = width // heads
    stream = gpt_stream(
        "transformer.blocks", n, embeddings=("transformer.wte.weight",),
        attn=(r"attn\.Wqkv", r"attn\.out_proj"), mlp_io=(r"ffn\.up_proj", r"ffn\.down_proj"),
        norms={"norm_1": ("attn.Wqkv",), "norm_2": ("ffn.up_proj",)},
        final="transformer.norm_f", norm_bias=False,
    )  # fmt: skip
    atts = []
    for i in range(n):
        pre = f"transformer.blocks.{i}.attn."
        atts.append(
            Attention(
                q=linear(pre + "Wqkv", query_index(heads, d, heads), bias=False),
                k=linear(pre + "Wqkv", kv_index(heads, d, width), bias=False),
                v=linear(pre + "Wqkv", kv_index(heads, d, 2 * width), bias=False),
                o=reader(pre + "out_proj", query_index(heads, d, heads)),
                qk=QK("full"),
                heads_move=False,
            )
        )
    units = _units("transformer.blocks", n, "ffn.up_proj", "ffn.down_proj",
                   cfg.expansion_ratio * width, False)  # fmt: skip
    return Layout((stream,), units, (), tuple(atts))
