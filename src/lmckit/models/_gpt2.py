"""GPT-2 (Radford et al., 2019): a pre-norm decoder-only transformer language model.

Module names follow Hugging Face's ``GPT2LMHeadModel`` so checkpoints map one to one,
except that the projections are ``nn.Linear`` (HF's ``Conv1D`` stores the transposed
weight, ``(in, out)``; an adapter transposes it)::

    transformer.wte               Embedding(vocab_size, n_embd)
    transformer.wpe               Embedding(context, n_embd)
    transformer.h.{i}.ln_1        norm over n_embd
    transformer.h.{i}.attn.c_attn Linear(n_embd, 3 n_embd): fused [q; k; v] rows
    transformer.h.{i}.attn.c_proj Linear(n_embd, n_embd)
    transformer.h.{i}.ln_2        norm over n_embd
    transformer.h.{i}.mlp.c_fc    Linear(n_embd, n_inner)
    transformer.h.{i}.mlp.c_proj  Linear(n_inner, n_embd)
    transformer.ln_f              norm over n_embd
    lm_head                       Linear(n_embd, vocab_size); absent when tied

With ``tie_embeddings`` (the default) the logits are ``ln_f(x) @ wte.weight^T`` and the
state dict holds no ``lm_head.weight`` (one tensor, so ``functional_call`` and the
symmetry algebra see a single parameter; it writes and reads the residual stream
alike, which is exact for permutations and orthogonal maps).

Spaces of the spec: ``residual`` (the residual stream; ``Permutation`` with
LayerNorm, ``Orthogonal`` with ``norm="rms"``), ``heads.{i}`` (head permutations,
matched by QK/OV circuits) and ``ffn.{i}`` (MLP neurons, permutations).

With ``attention="circuits"`` each ``transformer.h.{i}.attn`` is a
:class:`~lmckit.models._transformer_blocks.CircuitAttention` (``qk_weight``, ``qk_bias``,
``ov_weight``, ``ov_bias``) instead of ``c_attn`` and ``c_proj``.
"""

from __future__ import annotations

import math
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

__all__ = ["GPT2"]


class GPT2Attention(nn.Module):
    """Causal self-attention with a fused QKV projection."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head = n_head
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        drop = self.dropout if self.training else 0.0
        y = multi_head_attention(q, k, v, self.n_head, causal=True, dropout=drop)
        return self.resid_dropout(self.c_proj(y))


class GPT2MLP(nn.Module):
    """``c_proj(gelu_new(c_fc(x)))``; ``gelu_new`` is the tanh approximation of GELU."""

    def __init__(self, n_embd: int, n_inner: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, n_inner)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(n_inner, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPT2Block(nn.Module):
    """Pre-norm block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        n_inner: int,
        norm: str,
        eps: float,
        dropout: float,
        attention: str = "heads",
    ) -> None:
        super().__init__()
        self.ln_1 = make_residual_norm(norm, n_embd, eps)
        self.attn: nn.Module
        if attention == "heads":
            self.attn = GPT2Attention(n_embd, n_head, dropout)
        else:
            self.attn = CircuitAttention(n_embd, n_head, causal=True, dropout=dropout)
        self.ln_2 = make_residual_norm(norm, n_embd, eps)
        self.mlp = GPT2MLP(n_embd, n_inner, dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


@register_model("gpt2")
class GPT2(ZooModel):
    """GPT-2 language model: token ids ``(batch, time)`` -> logits ``(batch, time, vocab)``.

    Args:
        vocab_size: number of token ids.
        n_layer, n_head, n_embd: depth, heads per layer, residual width
            (``n_embd % n_head == 0``).
        n_inner: MLP width (default ``4 * n_embd``).
        context: maximum sequence length (position embeddings).
        norm: ``"layer"`` (GPT-2) or ``"rms"`` (affine-free RMSNorm, see
            :mod:`lmckit.models._transformer_blocks`).
        tie_embeddings: ``lm_head.weight`` is ``transformer.wte.weight``.
        lm_head_bias: give the LM head a bias (the LayerNorm -> RMSNorm rewrite folds
            ``ln_f``'s bias into it).
        dropout: embedding, attention and residual dropout.
        layer_norm_epsilon: the norms' ``eps``.
        attention: ``"heads"`` (projections) or ``"circuits"`` (each head's QK and OV
            circuit, see :func:`lmckit.forms.heads_to_circuits`).
    """

    space_names = {
        "transformer.h.{i}.attn": "heads.{i}",
        "transformer.h.{i}.attn.c_attn": "heads.{i}",
        "transformer.h.{i}.mlp.c_fc": "ffn.{i}",
    }

    def __init__(
        self,
        vocab_size: int,
        n_layer: int = 6,
        n_head: int = 4,
        n_embd: int = 256,
        n_inner: int | None = None,
        context: int = 256,
        *,
        norm: str = "layer",
        tie_embeddings: bool = True,
        lm_head_bias: bool = False,
        dropout: float = 0.0,
        layer_norm_epsilon: float = 1e-5,
        attention: str = "heads",
    ) -> None:
        super().__init__()
        check_transformer_norm(norm)
        check_attention_form(attention)
        n_inner = 4 * n_embd if n_inner is None else n_inner
        if min(vocab_size, n_layer, n_head, n_embd, n_inner, context) < 1:
            raise ValueError("GPT-2 sizes must be positive")
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not a multiple of n_head={n_head}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab_size, n_embd),
                "wpe": nn.Embedding(context, n_embd),
                "drop": nn.Dropout(dropout),
                "h": nn.ModuleList(
                    GPT2Block(n_embd, n_head, n_inner, norm, layer_norm_epsilon, dropout, attention)
                    for _ in range(n_layer)
                ),
                "ln_f": make_residual_norm(norm, n_embd, layer_norm_epsilon),
            }
        )
        if tie_embeddings and lm_head_bias:
            raise ValueError("a tied LM head has no bias; set tie_embeddings=False")
        self.lm_head = None if tie_embeddings else nn.Linear(n_embd, vocab_size, bias=lm_head_bias)
        self.n_layer, self.n_head, self.n_embd, self.n_inner = n_layer, n_head, n_embd, n_inner
        self.context, self.norm, self.tie_embeddings = context, norm, tie_embeddings
        self.layer_norm_epsilon, self.attention = layer_norm_epsilon, attention
        self.vocab_size = vocab_size
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 L)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.ndim == 2:
                std = 0.02 / math.sqrt(2 * self.n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: Tensor) -> Tensor:
        if idx.ndim != 2 or idx.shape[1] > self.context:
            raise ValueError(
                f"expected token ids (batch, time <= {self.context}), got {tuple(idx.shape)}"
            )
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if self.lm_head is None:
            return x @ self.transformer.wte.weight.T
        return self.lm_head(x)

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (``transformers``' name for it)."""
        wte = self.transformer.wte
        assert isinstance(wte, nn.Embedding)
        return wte

    def get_output_embeddings(self) -> nn.Module:
        """The layer whose rows are the tokens' logits: the LM head, or the token
        embedding when they are tied."""
        return self.get_input_embeddings() if self.lm_head is None else self.lm_head

    # ------------------------------------------------------------------ symmetry

    def example_inputs(self) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        return (torch.randint(0, self.vocab_size, (2, min(self.context, 8)), generator=gen),)

    def repair_sites(self) -> list[str]:
        return [f"transformer.h.{i}.mlp.c_fc" for i in range(self.n_layer)]

    # ------------------------------------------------------------------ rewrites

    def untied(self, params: Params) -> Params:
        """``params`` of the untied layout (adds ``lm_head.weight``, a copy of ``wte``)."""
        if not self.tie_embeddings:
            return dict(params)
        return {**params, "lm_head.weight": params["transformer.wte.weight"].clone()}

    def rms_kwargs(self) -> dict[str, Any]:
        """Constructor changes for the RMSNorm form (folding ``ln_f`` unties the head)."""
        return {"norm": "rms", "tie_embeddings": False, "lm_head_bias": True}

    def widened_kwargs(self, width: int, inner: int) -> dict[str, Any]:
        """Constructor changes for a model of residual width ``width``, MLP width ``inner``."""
        # RMSNorm divides by sqrt(|x|^2 / width + eps): scaling eps by n / width keeps the
        # norm of an embedded narrow stream exact up to the factor sqrt(width / n)
        eps = self.layer_norm_epsilon * self.n_embd / width
        return {"n_embd": width, "n_inner": inner, "layer_norm_epsilon": eps}
