"""Tiny models every test file shares: one small configuration per zoo model, and tiny
random Hugging Face folders (2 layers, width 32) built from configs; nothing is downloaded.

:func:`build_hf_folder` writes one with ``save_pretrained``; every weight is moved by
0.1 N(0, 1) after initialisation, so norms and biases are not the trivial 1 and 0 and
every weight matters. ``transformers`` is imported only when a folder is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: The smallest instance of each zoo model the tests use (``create_model(name, **TINY[name])``):
#: 8x8 single-channel images with 3 classes, or 11 tokens of context 6.
TINY: dict[str, dict[str, Any]] = {
    "mlp": {"in_features": 12, "hidden": [8, 8], "out_features": 3},
    # 8x8 -> 4x4 -> 2x2 -> 1x1, the last pool is skipped
    "vgg": {
        "in_channels": 1,
        "num_classes": 3,
        "image_size": 8,
        "widths": [8, "M", 16, "M", 16, "M", "M"],
    },  # fmt: skip
    "resnet20": {"in_channels": 1, "num_classes": 3, "width_mult": 1},
    "gpt2": {"vocab_size": 11, "n_layer": 2, "n_head": 2, "n_embd": 8, "n_inner": 12, "context": 6},
    "vit": {
        "image_size": 8,
        "patch_size": 4,
        "in_channels": 1,
        "num_classes": 3,
        "width": 8,
        "depth": 2,
        "heads": 2,
        "mlp_dim": 12,
    },
}

#: Transformers with four heads of width 4 (aligner tests: heads to permute, bases in them).
FOUR_HEADS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "vocab_size": 17,
        "n_layer": 2,
        "n_head": 4,
        "n_embd": 16,
        "n_inner": 24,
        "context": 8,
    },  # fmt: skip
    "vit": {
        "image_size": 8,
        "patch_size": 4,
        "in_channels": 1,
        "num_classes": 3,
        "width": 16,
        "depth": 2,
        "heads": 4,
        "mlp_dim": 24,
    },
}


@dataclass(frozen=True)
class Family:
    """One ``transformers`` family and how the tests treat it."""

    config: str  # config class
    model: str  # model class (config.json's architectures[0])
    auto: str  # the Auto class that loads the folder
    kwargs: dict[str, Any]
    #: FFN units of layer 0: (parameter, axis) pairs that one permutation of the units moves
    ffn: tuple[tuple[str, int], ...] = field(default=())


_TEXT = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, intermediate_size=37)
_DECODER = dict(_TEXT, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
_GATED = (
    ("model.layers.0.mlp.gate_proj.weight", 0),
    ("model.layers.0.mlp.up_proj.weight", 0),
    ("model.layers.0.mlp.down_proj.weight", 1),
)

FAMILIES: dict[str, Family] = {
    "gpt2": Family(
        "GPT2Config",
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        # bos/eos inside the tiny vocabulary (the defaults, 50256, are not)
        dict(vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=2, n_inner=37)
        | dict(bos_token_id=0, eos_token_id=0),
        (
            ("transformer.h.0.mlp.c_fc.weight", 1),  # Conv1D: (in, out)
            ("transformer.h.0.mlp.c_fc.bias", 0),
            ("transformer.h.0.mlp.c_proj.weight", 0),
        ),
    ),
    "bert": Family(
        "BertConfig",
        "BertForMaskedLM",
        "AutoModelForMaskedLM",
        dict(_TEXT, num_attention_heads=4, max_position_embeddings=16),
        (
            ("bert.encoder.layer.0.intermediate.dense.weight", 0),
            ("bert.encoder.layer.0.intermediate.dense.bias", 0),
            ("bert.encoder.layer.0.output.dense.weight", 1),
        ),
    ),
    "vit": Family(
        "ViTConfig",
        "ViTForImageClassification",
        "AutoModelForImageClassification",
        dict(
            image_size=8,
            patch_size=4,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            num_labels=3,
        ),
        (
            ("vit.layers.0.mlp.fc1.weight", 0),
            ("vit.layers.0.mlp.fc1.bias", 0),
            ("vit.layers.0.mlp.fc2.weight", 1),
        ),
    ),
    # grouped-query attention: 4 query heads share 2 key/value heads
    "llama": Family("LlamaConfig", "LlamaForCausalLM", "AutoModelForCausalLM", _DECODER, _GATED),
    "mistral": Family(
        "MistralConfig", "MistralForCausalLM", "AutoModelForCausalLM", _DECODER, _GATED
    ),
}


_SMALL = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
_SMALL_GPT = dict(vocab_size=61, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
_IMAGE = dict(num_labels=3, image_size=16)
#: token ids inside the tiny vocabulary (several configs default to ids of their real one)
_IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)
_EXPERTS = dict(num_experts=4, num_experts_per_tok=2)


def _family(config: str, model: str, auto: str, **kwargs: Any) -> Family:
    return Family(config, model, auto, kwargs)


#: Every family the coverage test (tests/hf/test_families.py) and docs/families.md cover,
#: beyond :data:`FAMILIES`: each as small as its config allows (2 layers, width 32,
#: 4 heads; 2 key/value heads where the family has grouped-query attention).
MORE_FAMILIES: dict[str, Family] = {
    # grouped matrix products need rows of a multiple of 16 bytes: 48 units, not 37
    "mixtral": _family(
        "MixtralConfig", "MixtralForCausalLM", "AutoModelForCausalLM",
        **(_DECODER | dict(intermediate_size=48)), num_local_experts=4, num_experts_per_tok=2,
    ),
    "qwen2": _family("Qwen2Config", "Qwen2ForCausalLM", "AutoModelForCausalLM", **_DECODER),
    "gemma": _family(
        "GemmaConfig", "GemmaForCausalLM", "AutoModelForCausalLM", **_DECODER, head_dim=8
    ),
    "phi": _family(
        "PhiConfig", "PhiForCausalLM", "AutoModelForCausalLM", **_TEXT, num_attention_heads=4
    ),
    "phi3": _family(
        "Phi3Config", "Phi3ForCausalLM", "AutoModelForCausalLM",
        **_DECODER, pad_token_id=0, bos_token_id=0, eos_token_id=0,
    ),
    "gpt_neox": _family(
        "GPTNeoXConfig", "GPTNeoXForCausalLM", "AutoModelForCausalLM",
        **_TEXT, num_attention_heads=4,
    ),
    "gptj": _family(
        "GPTJConfig", "GPTJForCausalLM", "AutoModelForCausalLM",
        **_SMALL_GPT, n_inner=37, rotary_dim=4,
    ),
    "opt": _family(
        "OPTConfig", "OPTForCausalLM", "AutoModelForCausalLM",
        **_SMALL, ffn_dim=37, word_embed_proj_dim=32, pad_token_id=1, bos_token_id=0,
        eos_token_id=0,
    ),
    "bloom": _family(
        "BloomConfig", "BloomForCausalLM", "AutoModelForCausalLM",
        vocab_size=61, hidden_size=32, n_layer=2, n_head=4,
    ),
    "falcon": _family("FalconConfig", "FalconForCausalLM", "AutoModelForCausalLM", **_SMALL),
    "roberta": _family(
        "RobertaConfig", "RobertaForMaskedLM", "AutoModelForMaskedLM",
        **_TEXT, num_attention_heads=4, pad_token_id=1,
    ),
    "distilbert": _family(
        "DistilBertConfig", "DistilBertForMaskedLM", "AutoModelForMaskedLM",
        vocab_size=61, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
    ),
    "electra": _family(
        "ElectraConfig", "ElectraForMaskedLM", "AutoModelForMaskedLM",
        **_TEXT, num_attention_heads=4, embedding_size=32,
    ),
    "deberta-v2": _family(
        "DebertaV2Config", "DebertaV2ForMaskedLM", "AutoModelForMaskedLM",
        **_TEXT, num_attention_heads=4,
    ),
    "t5": _family(
        "T5Config", "T5ForConditionalGeneration", "AutoModelForSeq2SeqLM",
        vocab_size=61, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        decoder_start_token_id=0,
    ),
    "bart": _family(
        "BartConfig", "BartForConditionalGeneration", "AutoModelForSeq2SeqLM",
        vocab_size=61, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
        decoder_ffn_dim=37, max_position_embeddings=16, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
    ),
    "clip": _family(
        "CLIPTextConfig", "CLIPTextModel", "AutoModel",
        **_SMALL, intermediate_size=37, max_position_embeddings=16, bos_token_id=0,
        eos_token_id=2, pad_token_id=1,
    ),
    "convnext": _family(
        "ConvNextConfig", "ConvNextForImageClassification", "AutoModelForImageClassification",
        **_IMAGE, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
    ),
    "resnet": _family(
        "ResNetConfig", "ResNetForImageClassification", "AutoModelForImageClassification",
        **_IMAGE, hidden_sizes=[8, 16], depths=[1, 1], embedding_size=8,
    ),
    # --- 2025-2026 decoders: qk-norm, sandwich norms, partial and interleaved rotary, NoPE
    "qwen3": _family(
        "Qwen3Config", "Qwen3ForCausalLM", "AutoModelForCausalLM", **_DECODER, **_IDS, head_dim=8
    ),
    "olmo2": _family("Olmo2Config", "Olmo2ForCausalLM", "AutoModelForCausalLM", **_DECODER, **_IDS),
    "gemma2": _family(
        "Gemma2Config", "Gemma2ForCausalLM", "AutoModelForCausalLM", **_DECODER, **_IDS, head_dim=8
    ),
    "gemma3": _family(
        "Gemma3TextConfig", "Gemma3ForCausalLM", "AutoModelForCausalLM",
        **_DECODER, **_IDS, head_dim=8,
    ),
    "cohere": _family(
        "CohereConfig", "CohereForCausalLM", "AutoModelForCausalLM", **_DECODER, **_IDS
    ),
    "stablelm": _family(
        "StableLmConfig", "StableLmForCausalLM", "AutoModelForCausalLM", **_DECODER, **_IDS
    ),
    "starcoder2": _family(
        "Starcoder2Config", "Starcoder2ForCausalLM", "AutoModelForCausalLM", **_DECODER, **_IDS
    ),
    # Granite's multipliers away from 1, so that they matter
    "granite": _family(
        "GraniteConfig", "GraniteForCausalLM", "AutoModelForCausalLM", **_DECODER, **_IDS,
        embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3,
        logits_scaling=2.0,
    ),
    "nemotron": _family(
        "NemotronConfig", "NemotronForCausalLM", "AutoModelForCausalLM", **_DECODER, **_IDS
    ),
    # a NoPE layer every second layer: layer 1 has no rotary positions
    "smollm3": _family(
        "SmolLM3Config", "SmolLM3ForCausalLM", "AutoModelForCausalLM", **_DECODER, **_IDS,
        no_rope_layer_interval=2,
    ),
    # ALiBi, a fused Wqkv, LayerNorms without bias
    "mpt": _family(
        "MptConfig", "MptForCausalLM", "AutoModelForCausalLM",
        vocab_size=61, d_model=32, n_layers=2, n_heads=4, expansion_ratio=2, max_seq_len=16,
        **_IDS,
    ),
    # --- mixtures of experts
    "qwen3_moe": _family(
        "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "AutoModelForCausalLM",
        **_DECODER, **_IDS, **_EXPERTS, head_dim=8, moe_intermediate_size=48,
    ),
    "qwen2_moe": _family(
        "Qwen2MoeConfig", "Qwen2MoeForCausalLM", "AutoModelForCausalLM",
        **_DECODER, **_IDS, **_EXPERTS, moe_intermediate_size=48,
        shared_expert_intermediate_size=48,
    ),
    "olmoe": _family(
        "OlmoeConfig", "OlmoeForCausalLM", "AutoModelForCausalLM",
        **(_DECODER | dict(intermediate_size=48)), **_IDS, **_EXPERTS,
    ),
    # multi-head latent attention; layer 0 a dense MLP, layer 1 routed and shared experts
    "deepseek_v3": _family(
        "DeepseekV3Config", "DeepseekV3ForCausalLM", "AutoModelForCausalLM",
        **(_DECODER | dict(intermediate_size=48, num_key_value_heads=4)), **_IDS,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, n_group=1,
        topk_group=1, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
        qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
    ),
    # --- encoders
    "modernbert": _family(
        "ModernBertConfig", "ModernBertForMaskedLM", "AutoModelForMaskedLM",
        **_SMALL, intermediate_size=37, max_position_embeddings=16, pad_token_id=0,
        bos_token_id=0, eos_token_id=0, cls_token_id=0, sep_token_id=0,
    ),
    "xlm-roberta": _family(
        "XLMRobertaConfig", "XLMRobertaForMaskedLM", "AutoModelForMaskedLM",
        **_TEXT, num_attention_heads=4, max_position_embeddings=20, pad_token_id=1,
    ),
    # one layer's weights shared by both layers; embeddings of width 16 mapped to 32
    "albert": _family(
        "AlbertConfig", "AlbertForMaskedLM", "AutoModelForMaskedLM",
        **_TEXT, num_attention_heads=4, max_position_embeddings=16, embedding_size=16,
    ),
    # --- an encoder-decoder for speech
    "whisper": _family(
        "WhisperConfig", "WhisperForConditionalGeneration", "AutoModelForSpeechSeq2Seq",
        vocab_size=61, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
        decoder_ffn_dim=37, num_mel_bins=8, max_source_positions=8, max_target_positions=16,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=0,
    ),
    # --- vision
    "dinov2": _family(
        "Dinov2Config", "Dinov2ForImageClassification", "AutoModelForImageClassification",
        **_IMAGE, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        mlp_ratio=2,
    ),
    "siglip": _family(
        "SiglipConfig", "SiglipForImageClassification", "AutoModelForImageClassification",
        num_labels=3, text_config=dict(vocab_size=61, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=4, intermediate_size=37, **_IDS), vision_config=dict(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=37, vision_use_head=False),
    ),
    "deit": _family(
        "DeiTConfig", "DeiTForImageClassification", "AutoModelForImageClassification",
        **_IMAGE, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37,
    ),
    "beit": _family(
        "BeitConfig", "BeitForImageClassification", "AutoModelForImageClassification",
        **_IMAGE, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, use_relative_position_bias=True,
    ),
    # windowed attention with relative position tables; patch merging between stages
    "swin": _family(
        "SwinConfig", "SwinForImageClassification", "AutoModelForImageClassification",
        **_IMAGE, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
    ),
}  # fmt: skip
ALL_FAMILIES = FAMILIES | MORE_FAMILIES


def build_hf_folder(
    family: str,
    path: Path,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    shard_size: int | None = None,
    **overrides: Any,
) -> Path:
    """Write a tiny random ``family`` model to ``path`` (``save_pretrained``, in shards of
    at most ``shard_size`` bytes when given); return ``path``."""
    import transformers

    fam = ALL_FAMILIES[family]
    config = getattr(transformers, fam.config)(**{**fam.kwargs, **overrides})
    with torch.random.fork_rng(devices=[]):  # transformers initialises from the global RNG
        torch.manual_seed(seed)
        model = getattr(transformers, fam.model)(config).eval()
        with torch.no_grad():
            for p in model.parameters():  # tied weights are one parameter: they stay tied
                p.add_(0.1 * torch.randn_like(p))
    if shard_size is None:
        model.to(dtype).save_pretrained(path)
    else:
        model.to(dtype).save_pretrained(path, max_shard_size=shard_size)
    return path


def auto_load(family: str, path: Path) -> torch.nn.Module:
    """``AutoModel*.from_pretrained(path)``: what a ``transformers`` user gets from the folder."""
    import transformers

    return getattr(transformers, ALL_FAMILIES[family].auto).from_pretrained(path).eval()
