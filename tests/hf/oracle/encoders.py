"""Layouts of encoders (masked language models), read from each family's ``modeling_*.py``.

In every masked-LM head here the decoder is tied to the token embedding: it reads the
head's hidden space with the embedding's columns, so that space (the head's dense rows,
its norm) moves with the residual stream too.
"""

from __future__ import annotations

from typing import Any

from .engine import QK, Attention, Layout, Stream
from .layouts import attention, kv_index, layout, linear, mlp, query_index, reader, rotary


def _mlm_head(dense: str, norm: str, decoder: str) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Uses and scales of a tied masked-LM head: dense (stream -> stream), norm, decoder."""
    uses = (
        (rf"{dense}\.weight", 0),
        (rf"{dense}\.weight", 1),
        (rf"{dense}\.bias", 0),
        (rf"{norm}\.bias", 0),
        (rf"{decoder}\.weight", 1),
    )
    return uses, ((rf"{norm}\.weight", 0),)


def bert_like(
    cfg: Any,
    base: str,
    head: tuple[str, str, str],
    *,
    names: tuple[str, str, str] = ("query", "key", "value"),
) -> Layout:
    """BERT's encoder under ``base`` (post-LayerNorm: attention.output.LayerNorm and
    output.LayerNorm after each sum; absolute positions, so any orthogonal query/key map)."""
    layer = rf"{base}\.encoder\.layer\.\d+\."
    head_uses, head_scales = _mlm_head(*head)
    norms = (rf"{base}\.embeddings\.LayerNorm", layer + r"(attention\.)?output\.LayerNorm")
    stream = Stream(
        (
            (rf"{base}\.embeddings\.\w+_embeddings\.weight", 1),
            (layer + rf"attention\.self\.({'|'.join(names)})\.weight", 1),
            (layer + r"(attention\.)?output\.dense\.(weight|bias)", 0),
            (layer + r"intermediate\.dense\.weight", 1),
            *((rf"{n}\.bias", 0) for n in norms),
            *head_uses,
        ),
        (*((rf"{n}\.weight", 0) for n in norms), *head_scales),
        centered=True,
    )
    pre = f"{base}.encoder.layer.{{}}."
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp(
                [pre.format(i) + "intermediate.dense"],
                pre.format(i) + "output.dense",
                cfg.intermediate_size,
                bias=True,
            )
            for i in range(cfg.num_hidden_layers)
        ),
        attention=tuple(
            attention(
                pre.format(i) + "attention.",
                cfg,
                QK("full"),
                bias=True,
                names=tuple(f"self.{n}" for n in names) + ("output.dense",),
            )  # type: ignore[arg-type]
            for i in range(cfg.num_hidden_layers)
        ),
    )


@layout("bert")
def _bert(cfg: Any) -> Layout:
    return bert_like(
        cfg,
        "bert",
        (
            "cls.predictions.transform.dense",
            "cls.predictions.transform.LayerNorm",
            "cls.predictions.decoder",
        ),
    )


@layout("roberta", "xlm-roberta")
def _roberta(cfg: Any) -> Layout:
    return bert_like(cfg, "roberta", ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder"))


@layout("electra")
def _electra(cfg: Any) -> Layout:  # embedding_size == hidden_size: no embeddings_project
    return bert_like(
        cfg,
        "electra",
        ("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head"),
    )


@layout("deberta-v2")
def _deberta_v2(cfg: Any) -> Layout:  # the tiny config: absolute positions, no relative attention
    return bert_like(
        cfg,
        "deberta",
        (
            "cls.predictions.transform.dense",
            "cls.predictions.transform.LayerNorm",
            "cls.predictions.decoder",
        ),
        names=("query_proj", "key_proj", "value_proj"),
    )


@layout("distilbert")
def _distilbert(cfg: Any) -> Layout:
    layer = r"distilbert\.transformer\.layer\.\d+\."
    head_uses, head_scales = _mlm_head("vocab_transform", "vocab_layer_norm", "vocab_projector")
    norms = (r"distilbert\.embeddings\.LayerNorm", layer + r"(sa|output)_layer_norm")
    stream = Stream(
        (
            (r"distilbert\.embeddings\.\w+_embeddings\.weight", 1),
            (layer + r"attention\.[qkv]_lin\.weight", 1),
            (layer + r"(attention\.out_lin|ffn\.lin2)\.(weight|bias)", 0),
            (layer + r"ffn\.lin1\.weight", 1),
            *((rf"{n}\.bias", 0) for n in norms),
            *head_uses,
        ),
        (*((rf"{n}\.weight", 0) for n in norms), *head_scales),
        centered=True,
    )
    pre = "distilbert.transformer.layer.{}."
    return Layout(
        streams=(stream,),
        units=tuple(
            mlp([pre.format(i) + "ffn.lin1"], pre.format(i) + "ffn.lin2", cfg.hidden_dim, bias=True)
            for i in range(cfg.n_layers)
        ),
        attention=tuple(
            attention(
                pre.format(i) + "attention.",
                _Heads(cfg.n_heads, cfg.dim),
                QK("full"),
                bias=True,
                names=("q_lin", "k_lin", "v_lin", "out_lin"),
            )
            for i in range(cfg.n_layers)
        ),
    )


class _Heads:
    """Head counts under Llama's attribute names, for configs that call them otherwise."""

    def __init__(self, heads: int, hidden: int) -> None:
        self.num_attention_heads, self.hidden_size = heads, hidden


@layout("albert")
def _albert(cfg: Any) -> Layout:
    # two streams: the embeddings' (embedding_size), mapped into the hidden one by
    # embedding_hidden_mapping_in, and read back by the tied head (predictions.dense
    # writes it, predictions.decoder is the word embedding); every layer is one shared
    # layer (albert_layer_groups.0.albert_layers.0), so its symmetries act once
    shared = "albert.encoder.albert_layer_groups.0.albert_layers.0."
    layer = shared.replace(".", r"\.")
    embeddings = Stream(
        (
            (r"albert\.embeddings\.\w+_embeddings\.weight", 1),
            (r"albert\.embeddings\.LayerNorm\.bias", 0),
            (r"albert\.encoder\.embedding_hidden_mapping_in\.weight", 1),
            (r"predictions\.dense\.(weight|bias)", 0),
            (r"predictions\.LayerNorm\.bias", 0),
            (r"predictions\.decoder\.weight", 1),
        ),
        ((r"albert\.embeddings\.LayerNorm\.weight", 0), (r"predictions\.LayerNorm\.weight", 0)),
        centered=True,
    )
    hidden = Stream(
        (
            (r"albert\.encoder\.embedding_hidden_mapping_in\.(weight|bias)", 0),
            (layer + r"attention\.(query|key|value)\.weight", 1),
            (layer + r"(attention\.dense|ffn_output)\.(weight|bias)", 0),
            (layer + r"ffn\.weight", 1),
            (layer + r"(attention\.LayerNorm|full_layer_layer_norm)\.bias", 0),
            (r"predictions\.dense\.weight", 1),
        ),
        ((layer + r"(attention\.LayerNorm|full_layer_layer_norm)\.weight", 0),),
        centered=True,
    )
    return Layout(
        streams=(embeddings, hidden),
        units=(mlp([shared + "ffn"], shared + "ffn_output", cfg.intermediate_size, bias=True),),
        attention=(
            attention(
                shared + "attention.",
                cfg,
                QK("full"),
                bias=True,
                names=("query", "key", "value", "dense"),
            ),
        ),
    )


@layout("modernbert")
def _modernbert(cfg: Any) -> Layout:
    # Wqkv rows viewed (3, heads, head_dim); Wi rows [input | gate] (GeGLU); LayerNorms
    # without bias (norm_bias=False); rotary (half-split); the tied head as BERT's
    heads = cfg.num_attention_heads
    d, inner = cfg.hidden_size // heads, cfg.intermediate_size
    layer = r"model\.layers\.\d+\."
    stream = Stream(
        (
            (r"model\.embeddings\.tok_embeddings\.weight", 1),
            (layer + r"(attn\.Wqkv|mlp\.Wi)\.weight", 1),
            (layer + r"(attn|mlp)\.Wo\.weight", 0),
            (r"head\.dense\.weight", 0),
            (r"head\.dense\.weight", 1),
            (r"decoder\.weight", 1),
        ),
        (
            (r"model\.(embeddings\.norm|final_norm)\.weight", 0),
            (layer + r"(attn|mlp)_norm\.weight", 0),
            (r"head\.norm\.weight", 0),
        ),
        centered=True,
    )
    atts, units = [], []
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        qkv = pre + "attn.Wqkv"
        atts.append(
            Attention(
                q=linear(qkv, query_index(heads, d, heads), bias=False),
                k=linear(qkv, kv_index(heads, d, heads * d), bias=False),
                v=linear(qkv, kv_index(heads, d, 2 * heads * d), bias=False),
                o=reader(pre + "attn.Wo", query_index(heads, d, heads)),
                qk=rotary(cfg),
            )
        )
        units.append(mlp([pre + "mlp.Wi"], pre + "mlp.Wo", inner, bias=False, offsets=(0, inner)))
    return Layout((stream,), tuple(units), (), tuple(atts))


@layout("clip")
def _clip(cfg: Any) -> Layout:
    # CLIPTextModel returns the stream itself (after final_layer_norm): no residual map
    pre = "encoder.layers.{}."
    return Layout(
        units=tuple(
            mlp(
                [pre.format(i) + "mlp.fc1"],
                pre.format(i) + "mlp.fc2",
                cfg.intermediate_size,
                bias=True,
            )
            for i in range(cfg.num_hidden_layers)
        ),
        attention=tuple(
            attention(
                pre.format(i) + "self_attn.",
                cfg,
                QK("full"),
                bias=True,
                names=("q_proj", "k_proj", "v_proj", "out_proj"),
            )
            for i in range(cfg.num_hidden_layers)
        ),
    )
