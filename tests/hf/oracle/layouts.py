"""Building blocks of the hand-written layouts, and their registry.

A layout is a function of the family's ``transformers`` config (sizes only) returning a
:class:`~tests.hf.oracle.engine.Layout`; each is registered under the family's name in
:data:`LAYOUTS` by the modules :mod:`.decoders`, :mod:`.mixtures`, :mod:`.encoders` and
:mod:`.vision`, which read it from the family's ``modeling_*.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .engine import QK, Attention, Block, Layout, Units

LayoutFn = Callable[[Any], Layout]
LAYOUTS: dict[str, LayoutFn] = {}


def layout(*names: str) -> Callable[[LayoutFn], LayoutFn]:
    """Register a layout function under the family names given."""

    def register(fn: LayoutFn) -> LayoutFn:
        for name in names:
            LAYOUTS[name] = fn
        return fn

    return register


def query_index(heads: int, head_dim: int, groups: int, offset: int = 0) -> Tensor:
    """Query heads laid out one after the other, ``groups`` consecutive runs sharing a
    key/value head (``repeat_kv``): ``(groups, heads // groups, head_dim)``."""
    return torch.arange(heads * head_dim).view(groups, heads // groups, head_dim) + offset


def kv_index(groups: int, head_dim: int, offset: int = 0) -> Tensor:
    return torch.arange(groups * head_dim).view(groups, head_dim) + offset


def linear(name: str, index: Tensor, *, bias: bool, conv1d: bool = False) -> tuple[Block, ...]:
    """The output units ``index`` of a layer ``name`` (``nn.Linear``: rows of ``weight``;
    GPT-2's ``Conv1D``: its columns) and of its bias."""
    weight = Block(f"{name}.weight", 1 if conv1d else 0, index)
    return (weight, Block(f"{name}.bias", 0, index)) if bias else (weight,)


def reader(name: str, index: Tensor, *, conv1d: bool = False) -> tuple[Block, ...]:
    """The input units ``index`` of a layer ``name`` (columns of ``weight``)."""
    return (Block(f"{name}.weight", 0 if conv1d else 1, index),)


def mlp(
    ins: Sequence[str], out: str, units: int, *, bias: bool, offsets: Sequence[int] = (0,)
) -> Units:
    """MLP units: rows of every input layer (at each offset, for fused gate/up rows) and
    columns of the output layer."""
    index = torch.arange(units)
    blocks: list[Block] = []
    for name in ins:
        for offset in offsets:
            blocks += linear(name, index + offset, bias=bias)
    return Units((*blocks, *reader(out, index)))


def attention(
    pre: str,
    cfg: Any,
    qk: QK,
    *,
    names: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    bias: bool = False,
    head_dim: int | None = None,
    **kw: Any,
) -> Attention:
    """Separate query, key, value and output projections under ``pre``, heads laid out
    as in Llama (grouped-query attention through ``repeat_kv``)."""
    heads = cfg.num_attention_heads
    groups = getattr(cfg, "num_key_value_heads", None) or heads
    d = head_dim or getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    q, k, v, o = (pre + n for n in names)
    queries, keys = query_index(heads, d, groups), kv_index(groups, d)
    return Attention(
        q=linear(q, queries, bias=bias),
        k=linear(k, keys, bias=bias),
        v=linear(v, keys, bias=bias),
        o=reader(o, queries),
        qk=qk,
        **kw,
    )


def rotary(cfg: Any, kind: str = "half", head_dim: int | None = None) -> QK:
    """Rotary positions on the first ``partial_rotary_factor`` of each head's dims."""
    d = head_dim or getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    factor = (cfg.rope_parameters or {}).get("partial_rotary_factor", 1.0)
    return QK(kind, int(d * factor))  # type: ignore[arg-type]
