"""Layouts of mixtures of experts, read from each family's ``modeling_*.py``.

Experts are stacked (``experts.gate_up_proj``: ``(E, 2 * inner, hidden)``, rows
``[gate | up]``; ``experts.down_proj``: ``(E, hidden, inner)``) and chosen by a router
``gate.weight`` ``(E, hidden)``: permuting the experts permutes all three along ``E``.
"""

from __future__ import annotations

from typing import Any

import torch

from .decoders import _L, Decoder, Readers, _gated, decoder_stream, qk_norm_scales
from .engine import QK, Attention, Block, Experts, Layout, Units
from .layouts import attention, kv_index, layout, mlp, query_index, reader, rotary


def stacked_experts(pre: str, experts: int, inner: int, *extra: Block) -> Experts:
    """The experts of ``pre + "experts"`` with their router ``pre + "gate"``, and the
    units inside each (gate and up rows, down columns)."""
    index, units = torch.arange(experts), torch.arange(inner)
    gate_up, down = pre + "experts.gate_up_proj", pre + "experts.down_proj"
    return Experts(
        blocks=(
            Block(gate_up, 0, index),
            Block(down, 0, index),
            Block(pre + "gate.weight", 0, index),
            *extra,
        ),
        units=tuple(
            Units(
                (
                    Block(gate_up, 0, units, (e,)),
                    Block(gate_up, 0, units + inner, (e,)),
                    Block(down, 1, units, (e,)),
                )
            )
            for e in range(experts)
        ),
    )


_EXPERT_STREAM = (
    (_L + r"mlp\.gate\.weight", 1),
    (_L + r"mlp\.experts\.gate_up_proj", 2),
    (_L + r"mlp\.experts\.down_proj", 1),
)


def _routed(pre: str) -> Readers:
    """What reads the norm before a mixture: the router and every expert."""
    return ((pre + "mlp.gate.weight", 1), (pre + "mlp.experts.gate_up_proj", 2))


_MIXTURE = Decoder(mlp_in=(), extra_uses=_EXPERT_STREAM, mlp_readers=_routed)


def _mixture(
    cfg: Any, qk: QK, *, experts: int, bias: bool = False, qk_norm_per_head: bool = True
) -> Layout:
    layers = range(cfg.num_hidden_layers)
    inner = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    return Layout(
        streams=(decoder_stream(cfg, _MIXTURE),),
        experts=tuple(stacked_experts(f"model.layers.{i}.mlp.", experts, inner) for i in layers),
        attention=tuple(
            attention(
                f"model.layers.{i}.self_attn.",
                cfg,
                qk,
                bias=bias,
                **qk_norm_scales(cfg, i, qk_norm_per_head),
            )
            for i in layers
        ),
    )


@layout("mixtral")
def _mixtral(cfg: Any) -> Layout:
    return _mixture(cfg, rotary(cfg), experts=cfg.num_local_experts)


@layout("qwen3_moe")
def _qwen3_moe(cfg: Any) -> Layout:  # Qwen3's per-head qk-norm, every layer a mixture
    return _mixture(cfg, QK("plane_signs", rotary(cfg).rotary_dim), experts=cfg.num_experts)


@layout("olmoe")
def _olmoe(cfg: Any) -> Layout:  # OLMo2's qk-norm over the whole projection
    qk = QK("plane_signs", rotary(cfg).rotary_dim)
    return _mixture(cfg, qk, experts=cfg.num_experts, qk_norm_per_head=False)


@layout("qwen2_moe")
def _qwen2_moe(cfg: Any) -> Layout:
    # routed experts beside a shared expert (a gated MLP) scaled by sigmoid(shared_expert_gate)
    base = _mixture(cfg, rotary(cfg), experts=cfg.num_experts, bias=True)
    shared = r"mlp\.shared_expert"

    def readers(pre: str) -> Readers:
        expert = pre + "mlp.shared_expert"
        return (*_routed(pre), (expert + ".gate_proj.weight", 1), (expert + ".up_proj.weight", 1),
                (expert + "_gate.weight", 1))  # fmt: skip

    extra = (
        *_EXPERT_STREAM,
        (_L + shared + r"\.(gate|up)_proj\.weight", 1),
        (_L + shared + r"\.down_proj\.weight", 0),
        (_L + shared + r"_gate\.weight", 1),
    )
    stream = decoder_stream(cfg, Decoder(mlp_in=(), extra_uses=extra, mlp_readers=readers))
    units = tuple(
        mlp(
            [
                f"model.layers.{i}.mlp.shared_expert.gate_proj",
                f"model.layers.{i}.mlp.shared_expert.up_proj",
            ],
            f"model.layers.{i}.mlp.shared_expert.down_proj",
            cfg.shared_expert_intermediate_size,
            bias=False,
        )
        for i in range(cfg.num_hidden_layers)
    )
    return Layout((stream,), units, base.experts, base.attention)


@layout("deepseek_v3")
def _deepseek_v3(cfg: Any) -> Layout:
    return Layout(
        streams=(_deepseek_stream(cfg),),
        units=tuple(u for i in range(cfg.num_hidden_layers) for u in _deepseek_units(cfg, i)),
        experts=tuple(
            stacked_experts(
                f"model.layers.{i}.mlp.",
                cfg.n_routed_experts,
                cfg.moe_intermediate_size,
                Block(
                    f"model.layers.{i}.mlp.gate.e_score_correction_bias",
                    0,
                    torch.arange(cfg.n_routed_experts),
                ),
            )
            for i in range(cfg.first_k_dense_replace, cfg.num_hidden_layers)
        ),
        attention=tuple(a for i in range(cfg.num_hidden_layers) for a in _latent(cfg, i)),
    )


def _deepseek_stream(cfg: Any) -> Any:
    def attn(pre: str) -> Readers:
        return ((pre + "self_attn.q_a_proj.weight", 1),
                (pre + "self_attn.kv_a_proj_with_mqa.weight", 1))  # fmt: skip

    def mlp_in(pre: str) -> Readers:
        if int(pre.split(".")[2]) < cfg.first_k_dense_replace:
            return _gated(pre)
        shared = pre + "mlp.shared_experts."
        return (*_routed(pre), (shared + "gate_proj.weight", 1), (shared + "up_proj.weight", 1))

    extra = (
        *_EXPERT_STREAM,
        (_L + r"self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight", 1),
        (_L + r"mlp\.shared_experts\.(gate|up)_proj\.weight", 1),
        (_L + r"mlp\.shared_experts\.down_proj\.weight", 0),
    )
    return decoder_stream(cfg, Decoder(extra_uses=extra, attn_readers=attn, mlp_readers=mlp_in))


def _deepseek_units(cfg: Any, i: int) -> list[Units]:
    """Layer ``i``'s units: a dense gated MLP (layers before ``first_k_dense_replace``) or
    the shared experts' units; and the two latents, each under an RMSNorm: the query
    latent (q_a rows, q_a_layernorm, q_b columns) and the key/value latent (the first
    kv_lora_rank rows of kv_a_proj_with_mqa, kv_a_layernorm, kv_b columns)."""
    pre = f"model.layers.{i}."
    name = "mlp." if i < cfg.first_k_dense_replace else "mlp.shared_experts."
    inner = cfg.intermediate_size if i < cfg.first_k_dense_replace else cfg.moe_intermediate_size
    dense = mlp(
        [pre + name + "gate_proj", pre + name + "up_proj"],
        pre + name + "down_proj",
        inner,
        bias=False,
    )
    att = pre + "self_attn."
    q_latent, kv_latent = torch.arange(cfg.q_lora_rank), torch.arange(cfg.kv_lora_rank)
    return [
        dense,
        Units(
            (
                Block(att + "q_a_proj.weight", 0, q_latent),
                Block(att + "q_a_layernorm.weight", 0, q_latent),
                *reader(att + "q_b_proj", q_latent),
            )
        ),
        Units(
            (
                Block(att + "kv_a_proj_with_mqa.weight", 0, kv_latent),
                Block(att + "kv_a_layernorm.weight", 0, kv_latent),
                *reader(att + "kv_b_proj", kv_latent),
            )
        ),
    ]


def _latent(cfg: Any, i: int) -> tuple[Attention, Attention]:
    """Multi-head latent attention: per head, q_b_proj rows ``[nope | rope]`` and kv_b_proj
    rows ``[key nope | value]``; one rotary key ``k_rot`` (the last rows of
    kv_a_proj_with_mqa) shared by every head. Two attentions: the heads with their
    position-free query/key and value bases (their rotary query rows moving with them),
    and the shared rotary planes (interleaved), one rotation for every head's rope rows."""
    heads, nope, rope, dv = (
        cfg.num_attention_heads,
        cfg.qk_nope_head_dim,
        cfg.qk_rope_head_dim,
        cfg.v_head_dim,
    )
    att = f"model.layers.{i}.self_attn."
    q_rows = (torch.arange(heads) * (nope + rope))[:, None]
    kv_rows = (torch.arange(heads) * (nope + dv))[:, None]
    rope_rows = q_rows + nope + torch.arange(rope)  # (heads, rope)
    q_b, kv_b = att + "q_b_proj.weight", att + "kv_b_proj.weight"
    heads_part = Attention(
        q=(Block(q_b, 0, (q_rows + torch.arange(nope))[:, None]),),
        k=(Block(kv_b, 0, kv_rows + torch.arange(nope)),),
        v=(Block(kv_b, 0, kv_rows + nope + torch.arange(dv)),),
        o=reader(att + "o_proj", query_index(heads, dv, heads)),
        qk=QK("full"),
        per_head=(Block(q_b, 0, rope_rows[:, None]),),
    )
    shared_rope = Attention(
        q=(Block(q_b, 0, rope_rows[None]),),
        k=(Block(att + "kv_a_proj_with_mqa.weight", 0, kv_index(1, rope, cfg.kv_lora_rank)),),
        v=(),
        o=(),
        qk=QK("interleaved", rope),
        heads_move=False,
    )
    return heads_part, shared_rope
