"""Families whose graphs glue axes from blocks, planted by hand from their own math.

* DeepSeek-V3 (multi-head latent attention, routed experts): the query and the key of
  each head are its own features beside rotary features the heads share, glued by a
  concatenation and by copies into a new tensor; the query and key/value latents sit
  between an a- and a b-projection with a norm between them; the router ranks experts
  after adding a per-expert correction bias.
* Swin (windowed attention): a relative position table per block adds one bias per head
  to the scores; windows are padded; patch merging concatenates four neighbours along
  the features.
* Dinov2 for classification: the class token beside the mean of the patch tokens,
  concatenated along the features, then one linear layer.

Each plant is written from the architecture (which rows and columns a head, a latent
unit or an expert owns), not from lmckit's spec: it must keep the logits, and
``lmckit align`` must undo it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from click.testing import CliRunner
from tests.planters import distance, orthogonal
from torch import Tensor, nn

from lmckit.cli import main
from lmckit.forms._recipe import aligned_form
from lmckit.groups import Orthogonal
from lmckit.hf import example_inputs, load_hf
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._params import module_params

Params = dict[str, Tensor]


def _tiny(config: str, model: str, seed: int = 0, **kwargs: object) -> nn.Module:
    """A random model of ``config`` with every weight and buffer moved off its start."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = getattr(transformers, model)(getattr(transformers, config)(**kwargs)).eval()
        with torch.no_grad():
            for p in module.parameters():
                p.add_(0.1 * torch.randn_like(p))
            for name, b in module.named_buffers():
                if name.endswith("correction_bias"):  # a router's per-expert preference
                    b.copy_(0.1 * torch.randn_like(b))
    return module


def _deepseek() -> nn.Module:
    return _tiny(
        "DeepseekV3Config", "DeepseekV3ForCausalLM",
        vocab_size=61, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
        topk_group=1, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=16,
    )  # fmt: skip


def _swin() -> nn.Module:
    return _tiny(
        "SwinConfig", "SwinForImageClassification",
        image_size=32, patch_size=4, num_channels=3, embed_dim=32, depths=[1, 1],
        num_heads=[2, 4], window_size=4, num_labels=3,
    )  # fmt: skip


def _dinov2() -> nn.Module:
    return _tiny(
        "Dinov2Config", "Dinov2ForImageClassification",
        image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=37, num_labels=3,
    )  # fmt: skip


def _state(module: nn.Module) -> Params:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _rows(w: Tensor, order: Tensor, block: int) -> Tensor:
    """``w`` with its rows in blocks of ``block`` (one per head) reordered by ``order``."""
    return w.reshape(len(order), block, *w.shape[1:])[order].reshape(w.shape)


def _cols(w: Tensor, order: Tensor, block: int) -> Tensor:
    return _rows(w.T, order, block).T


# --------------------------------------------------------------------------- plants


_MLA = "model.layers.0.self_attn."
_HEADS, _NOPE, _ROPE, _V, _LATENT = 4, 8, 8, 8, 16


def _plant_latents(p: Params, gen: torch.Generator) -> None:
    """Layer 0's query and key/value latents (between the a- and b-projections, with
    their norm's scale) permuted; the rotary key rows the heads share stay."""
    at = _MLA
    qa, kva = torch.randperm(_LATENT, generator=gen), torch.randperm(_LATENT, generator=gen)
    p[at + "q_a_proj.weight"] = p[at + "q_a_proj.weight"][qa]
    p[at + "q_a_layernorm.weight"] = p[at + "q_a_layernorm.weight"][qa]
    p[at + "q_b_proj.weight"] = p[at + "q_b_proj.weight"][:, qa]
    rows = torch.cat([kva, torch.arange(_LATENT, _LATENT + _ROPE)])
    p[at + "kv_a_proj_with_mqa.weight"] = p[at + "kv_a_proj_with_mqa.weight"][rows]
    p[at + "kv_a_layernorm.weight"] = p[at + "kv_a_layernorm.weight"][kva]
    p[at + "kv_b_proj.weight"] = p[at + "kv_b_proj.weight"][:, kva]


def _plant_experts(p: Params, gen: torch.Generator) -> None:
    """Layer 1's experts permuted (router rows, correction bias, stacked weights) and
    the units inside each expert (its gate and up rows, its down columns)."""
    moe = "model.layers.1.mlp."
    experts = torch.randperm(4, generator=gen)
    for key in ("gate.weight", "gate.e_score_correction_bias"):
        p[moe + key] = p[moe + key][experts]
    gate_up, down = p[moe + "experts.gate_up_proj"][experts], p[moe + "experts.down_proj"][experts]
    for e in range(4):
        units = torch.randperm(32, generator=gen)
        gate_up[e] = gate_up[e][torch.cat([units, units + 32])]
        down[e] = down[e][:, units]
    p[moe + "experts.gate_up_proj"], p[moe + "experts.down_proj"] = gate_up, down


def _plant_deepseek(p: Params, gen: torch.Generator) -> Params:
    """Layer 0's heads permuted (each head's query rows, key and value rows, output
    columns) and each head's own query/key features rotated (not the rotary ones); both
    latents; the experts and their units."""
    p = dict(p)
    at, block = _MLA, _NOPE + _ROPE
    order = torch.randperm(_HEADS, generator=gen)
    qb = _rows(p[at + "q_b_proj.weight"], order, block).clone()
    kvb = _rows(p[at + "kv_b_proj.weight"], order, _NOPE + _V).clone()
    for h in range(_HEADS):
        qk = orthogonal(_NOPE, gen).float()
        qb[h * block : h * block + _NOPE] = qk @ qb[h * block : h * block + _NOPE]
        start = h * (_NOPE + _V)
        kvb[start : start + _NOPE] = qk @ kvb[start : start + _NOPE]
    p[at + "q_b_proj.weight"], p[at + "kv_b_proj.weight"] = qb, kvb
    p[at + "o_proj.weight"] = _cols(p[at + "o_proj.weight"], order, _V)
    _plant_latents(p, gen)
    _plant_experts(p, gen)
    return p


def _rotate_values(p: Params, gen: torch.Generator) -> None:
    """Each head's value basis of layer 0 rotated: its value rows, its output columns."""
    kvb, out = p[_MLA + "kv_b_proj.weight"].clone(), p[_MLA + "o_proj.weight"].clone()
    for h in range(_HEADS):
        value = orthogonal(_V, gen).float()
        rows = slice(h * (_NOPE + _V) + _NOPE, (h + 1) * (_NOPE + _V))
        kvb[rows] = value @ kvb[rows]
        out[:, h * _V : (h + 1) * _V] = out[:, h * _V : (h + 1) * _V] @ value.T
    p[_MLA + "kv_b_proj.weight"], p[_MLA + "o_proj.weight"] = kvb, out


def _plant_deepseek_values(p: Params, gen: torch.Generator) -> Params:
    """Each head's value basis rotated, and both latents permuted."""
    p = dict(p)
    _rotate_values(p, gen)
    _plant_latents(p, gen)
    return p


def _plant_deepseek_heads_and_values(p: Params, gen: torch.Generator) -> Params:
    """Heads permuted and value bases rotated in one plant."""
    p = dict(p)
    order = torch.randperm(_HEADS, generator=gen)
    p[_MLA + "q_b_proj.weight"] = _rows(p[_MLA + "q_b_proj.weight"], order, _NOPE + _ROPE)
    p[_MLA + "kv_b_proj.weight"] = _rows(p[_MLA + "kv_b_proj.weight"], order, _NOPE + _V)
    p[_MLA + "o_proj.weight"] = _cols(p[_MLA + "o_proj.weight"], order, _V)
    _rotate_values(p, gen)
    return p


def _plant_swin(p: Params, gen: torch.Generator) -> Params:
    """The heads of both stages permuted, each with its relative position table column,
    and each head's value basis rotated (Swin-tiny's blocks: 2 then 4 heads of 16)."""
    p = dict(p)
    for stage, heads in ((0, 2), (1, 4)):
        at = f"swin.encoder.layers.{stage}.blocks.0.attention."
        dim = 16
        order = torch.randperm(heads, generator=gen)
        for name in ("q_proj", "k_proj", "v_proj"):
            p[at + f"{name}.weight"] = _rows(p[at + f"{name}.weight"], order, dim)
            p[at + f"{name}.bias"] = _rows(p[at + f"{name}.bias"], order, dim)
        p[at + "o_proj.weight"] = _cols(p[at + "o_proj.weight"], order, dim).clone()
        table = at + "relative_position_bias.relative_position_bias_table"
        p[table] = p[table][:, order]
        weight, bias = p[at + "v_proj.weight"].clone(), p[at + "v_proj.bias"].clone()
        out = p[at + "o_proj.weight"]
        for h in range(heads):
            value, rows = orthogonal(dim, gen).float(), slice(h * dim, (h + 1) * dim)
            weight[rows], bias[rows] = value @ weight[rows], value @ bias[rows]
            out[:, rows] = out[:, rows] @ value.T
        p[at + "v_proj.weight"], p[at + "v_proj.bias"] = weight, bias
    return p


#: a transformer block's parameters that write, read or scale its stream, and the axis
#: the stream is on (the same names in Swin's blocks and Dinov2's layers)
_BLOCK_STREAM = {
    "attention.q_proj.weight": 1, "attention.k_proj.weight": 1, "attention.v_proj.weight": 1,
    "attention.o_proj.weight": 0, "attention.o_proj.bias": 0, "mlp.fc1.weight": 1,
    "mlp.fc2.weight": 0, "mlp.fc2.bias": 0,
}  # fmt: skip
_SWIN_NORMS = ("layernorm_before.weight", "layernorm_before.bias", "layernorm_after.weight",
               "layernorm_after.bias")  # fmt: skip
_DINO_NORMS = ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
               "layer_scale1.lambda1", "layer_scale2.lambda1")  # fmt: skip


def _permute_block(p: Params, prefix: str, norms: tuple[str, ...], perm: Tensor) -> None:
    for name, axis in [*_BLOCK_STREAM.items(), *((n, 0) for n in norms)]:
        p[prefix + name] = p[prefix + name].index_select(axis, perm)


def _plant_swin_stream(p: Params, gen: torch.Generator) -> Params:
    """The stream of stage 0 permuted: the patch embedding's rows and norm, the block's
    readers and writers, and the four blocks of patch merging's norm and reduction
    columns, each by the same permutation (the four neighbours are four copies)."""
    p = dict(p)
    width = 32
    perm = torch.randperm(width, generator=gen)
    emb = "swin.embeddings."
    for key in ("patch_embeddings.projection.weight", "patch_embeddings.projection.bias",
                "norm.weight", "norm.bias"):  # fmt: skip
        p[emb + key] = p[emb + key][perm]
    _permute_block(p, "swin.encoder.layers.0.blocks.0.", _SWIN_NORMS, perm)
    merged = torch.cat([perm + k * width for k in range(4)])
    down = "swin.encoder.layers.0.downsample."
    for key in ("norm.weight", "norm.bias"):
        p[down + key] = p[down + key][merged]
    p[down + "reduction.weight"] = p[down + "reduction.weight"][:, merged]
    return p


def _plant_dinov2_stream(p: Params, gen: torch.Generator) -> Params:
    """The whole stream permuted: the embeddings (patch projection, class and mask
    tokens, positions), every layer's readers, writers, norms and layer scales, the final
    norm, and both blocks of the classifier's columns (the class token beside the mean of
    the patch tokens: two copies of the stream, moved alike)."""
    p = dict(p)
    width = 32
    perm = torch.randperm(width, generator=gen)
    emb = "dinov2.embeddings."
    for key in ("patch_embeddings.projection.weight", "patch_embeddings.projection.bias"):
        p[emb + key] = p[emb + key][perm]
    # the mask token too: Dinov2ForImageClassification passes bool_masked_pos on to its
    # embeddings, which put the token at the masked patches
    for key in ("cls_token", "mask_token", "position_embeddings"):
        p[emb + key] = p[emb + key][..., perm]
    for layer in range(2):
        _permute_block(p, f"dinov2.encoder.layer.{layer}.", _DINO_NORMS, perm)
    for key in ("dinov2.layernorm.weight", "dinov2.layernorm.bias"):
        p[key] = p[key][perm]
    p["classifier.weight"] = p["classifier.weight"][:, torch.cat([perm, perm + width])]
    return p


# --------------------------------------------------------------------------- checks


def _logits(module: nn.Module, params: Params, inputs: tuple[Tensor, ...]) -> Tensor:
    with torch.no_grad():
        return torch.func.functional_call(module, params, inputs).logits


def _moved_share(module: nn.Module) -> float:
    """The share of the parameters (elements) some inferred space moves."""
    analysis = analyze_symmetries(module, example_inputs(module))
    moved = {u.param for s in analysis.spec for u in s.uses}
    params = dict(module.named_parameters())
    return sum(v.numel() for k, v in params.items() if k in moved) / sum(
        v.numel() for v in params.values()
    )


@pytest.mark.parametrize(
    ("build", "share"),
    # what stays: the classifier's bias (the output), Dinov2's mask token (read only at
    # masked patches, and example_inputs masks none)
    [(_deepseek, 1.0), (_swin, 0.999), (_dinov2, 0.998)],
)
def test_nearly_every_parameter_moves(build: Callable[[], nn.Module], share: float) -> None:
    assert _moved_share(build()) >= share


def _align(module: nn.Module, planted: Params, tmp_path: Path) -> tuple[float, float]:
    """``lmckit align A B`` with B the planted copy: the distance to A before and after."""
    a = _state(module)
    module.save_pretrained(tmp_path / "a")
    module.load_state_dict(planted)
    module.save_pretrained(tmp_path / "b")
    module.load_state_dict(a)
    result = CliRunner().invoke(
        main,
        ["align", str(tmp_path / "a"), str(tmp_path / "b"), "--method", "weight",
         "--no-circuits", "--out", str(tmp_path / "out"), "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    aligned = load_hf(tmp_path / "out").params
    keys = [k for k in aligned if k in a]
    return distance({k: planted[k] for k in keys}, a), distance({k: aligned[k] for k in keys}, a)


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[Params, torch.Generator], Params]]] = {
    "deepseek_v3": (_deepseek, _plant_deepseek),
    "deepseek_v3_values": (_deepseek, _plant_deepseek_values),
    "swin": (_swin, _plant_swin),
    "swin_stream": (_swin, _plant_swin_stream),
    "dinov2": (_dinov2, _plant_dinov2_stream),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_plant_from_the_architecture_keeps_the_logits_and_align_undoes_it(
    case: str, tmp_path: Path
) -> None:
    build, plant = CASES[case]
    module = build()
    a = _state(module)
    planted = plant(a, torch.Generator().manual_seed(3))
    inputs = tuple(example_inputs(module))
    reference = _logits(module, a, inputs)
    assert float((_logits(module, planted, inputs) - reference).abs().max()) < 1e-4
    before, after = _align(module, planted, tmp_path)
    assert before > 0.5 and after / before < 1e-4, (before, after)


def test_deepseek_heads_permuted_and_value_bases_rotated_together(tmp_path: Path) -> None:
    module = _deepseek()
    a = _state(module)
    planted = _plant_deepseek_heads_and_values(a, torch.Generator().manual_seed(3))
    before, after = _align(module, planted, tmp_path)
    assert after / before < 1e-4, (before, after)


def test_deepseek_spaces_heads_latents_and_experts() -> None:
    module = _deepseek()
    analysis = analyze_symmetries(module, example_inputs(module))
    spec = analysis.spec
    # the heads of each layer, each head's own query/key features and its value basis
    for layer in range(2):
        heads = next(
            s
            for s in spec
            if s.name.startswith("heads")
            and any(u.param == f"model.layers.{layer}.self_attn.q_b_proj.weight" for u in s.uses)
        )
        assert heads.group.units(heads.n) == 4
        kinds = {s.nest.kind for s in spec.nested_in(heads.name) if s.nest is not None}
        assert kinds == {"qk", "value"}
        for latent in ("q_a_proj", "kv_a_proj_with_mqa"):
            assert f"model.layers.{layer}.self_attn.{latent}" in spec.names
    experts = spec["experts.0"]
    assert {u.param for u in experts.uses} >= {
        "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.gate.e_score_correction_bias",
    }
    assert len(spec.nested_in("experts.0")) == 4
    assert not [line for line in analysis.left_out if "changes the outputs" in line]


def test_deepseek_with_its_norms_folded_rotates_its_stream_and_both_latents() -> None:
    # the router reads the stream through a float32 cast of its weight: still a reader
    # the stream's norm scale folds into
    module = _deepseek()
    params = module_params(module)
    form = aligned_form(module, params, params, symmetry="orthogonal")
    groups = {s.name: s.group for s in form.spec}
    for name in ("residual", "model.layers.0.self_attn.q_a_proj",
                 "model.layers.0.self_attn.kv_a_proj_with_mqa"):  # fmt: skip
        assert groups[name] == Orthogonal(), name


def test_lmckit_symmetries_shows_experts_routed_by_groups_as_blocks(tmp_path: Path) -> None:
    """DeepSeek-V3 routing to the best of two groups of two experts: only permutations
    that map groups onto groups keep the choice, and the listing says so."""
    module = _tiny(
        "DeepseekV3Config", "DeepseekV3ForCausalLM",
        vocab_size=61, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=16,
    )  # fmt: skip
    module.save_pretrained(tmp_path / "m")
    result = CliRunner().invoke(main, ["symmetries", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    rows = {
        line.split()[0]: line.split()[1:] for line in result.output.splitlines() if line.strip()
    }
    assert rows["experts.0"][:2] == ["Permutation(2", "blocks)"]
    assert rows["heads.0"][0] == "Permutation" and "qk" in rows and "value" in rows
