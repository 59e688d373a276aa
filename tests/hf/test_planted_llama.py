"""`lmckit align` on a Llama pair related by symmetries planted by hand.

The planter below knows Llama's weight layout and nothing of lmckit's specs: it permutes
the key/value groups, the query heads inside each group, the MLP units; rotates each
group's value basis, each group's rotary query/key planes and (in the orthogonal form,
norm scales folded) the residual stream. `lmckit align` must recover A from B exactly
and write a folder that `from_pretrained` loads and that computes B's function.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from click.testing import CliRunner
from tests.planters import orthogonal, plane_rotation

from lmckit.cli import main
from lmckit.hf import load_hf

D_MODEL, HEADS, KV_HEADS, LAYERS = 32, 4, 2, 2
HEAD_DIM, PER_GROUP = D_MODEL // HEADS, HEADS // KV_HEADS


def _plant(state: dict[str, torch.Tensor], *, continuous: bool, seed: int) -> dict:
    """B's state dict from A's: every symmetry above, drawn at random."""
    gen = torch.Generator().manual_seed(seed)
    s = {k: v.double().clone() for k, v in state.items()}
    rot = orthogonal(D_MODEL, gen) if continuous else torch.eye(D_MODEL, dtype=torch.float64)
    if continuous:  # fold every norm scale into the layers reading it (RMSNorm form)
        for i in range(LAYERS):
            pre = f"model.layers.{i}."
            g_in = s.pop(pre + "input_layernorm.weight")
            for p in ("q_proj", "k_proj", "v_proj"):
                s[pre + f"self_attn.{p}.weight"] = s[pre + f"self_attn.{p}.weight"] * g_in
            g_post = s.pop(pre + "post_attention_layernorm.weight")
            for p in ("gate_proj", "up_proj"):
                s[pre + f"mlp.{p}.weight"] = s[pre + f"mlp.{p}.weight"] * g_post
            s[pre + "input_layernorm.weight"] = torch.ones_like(g_in)
            s[pre + "post_attention_layernorm.weight"] = torch.ones_like(g_post)
        g = s.pop("model.norm.weight")
        s["lm_head.weight"] = s["lm_head.weight"] * g
        s["model.norm.weight"] = torch.ones_like(g)
    # the residual stream: written by the embedding and every o/down projection
    s["model.embed_tokens.weight"] = s["model.embed_tokens.weight"] @ rot.T
    s["lm_head.weight"] = s["lm_head.weight"] @ rot.T
    for i in range(LAYERS):
        pre = f"model.layers.{i}."
        att, mlp = pre + "self_attn.", pre + "mlp."
        for p in ("q_proj", "k_proj", "v_proj"):
            s[att + f"{p}.weight"] = s[att + f"{p}.weight"] @ rot.T
        for p in ("gate_proj", "up_proj"):
            s[mlp + f"{p}.weight"] = s[mlp + f"{p}.weight"] @ rot.T
        s[att + "o_proj.weight"] = rot @ s[att + "o_proj.weight"]
        s[mlp + "down_proj.weight"] = rot @ s[mlp + "down_proj.weight"]
        # MLP units
        units = torch.randperm(s[mlp + "up_proj.weight"].shape[0], generator=gen)
        for p in ("gate_proj", "up_proj"):
            s[mlp + f"{p}.weight"] = s[mlp + f"{p}.weight"][units]
        s[mlp + "down_proj.weight"] = s[mlp + "down_proj.weight"][:, units]
        # heads, laid out (group, query head in group, head dim) on q rows / o columns
        q = s[att + "q_proj.weight"].reshape(KV_HEADS, PER_GROUP, HEAD_DIM, D_MODEL)
        k = s[att + "k_proj.weight"].reshape(KV_HEADS, HEAD_DIM, D_MODEL)
        v = s[att + "v_proj.weight"].reshape(KV_HEADS, HEAD_DIM, D_MODEL)
        o = s[att + "o_proj.weight"].reshape(D_MODEL, KV_HEADS, PER_GROUP, HEAD_DIM)
        groups = torch.randperm(KV_HEADS, generator=gen)
        q, k, v, o = q[groups], k[groups], v[groups], o[:, groups]
        for g in range(KV_HEADS):
            within = torch.randperm(PER_GROUP, generator=gen)
            q[g], o[:, g] = q[g][within], o[:, g][:, within]
            if continuous:
                planes, basis = plane_rotation(HEAD_DIM, gen), orthogonal(HEAD_DIM, gen)
                k[g] = planes @ k[g]
                q[g] = torch.einsum("ij,hjd->hid", planes, q[g])
                v[g] = basis @ v[g]
                o[:, g] = torch.einsum("dhj,ij->dhi", o[:, g], basis)
        s[att + "q_proj.weight"] = q.reshape(-1, D_MODEL)
        s[att + "k_proj.weight"] = k.reshape(-1, D_MODEL)
        s[att + "v_proj.weight"] = v.reshape(-1, D_MODEL)
        s[att + "o_proj.weight"] = o.reshape(D_MODEL, -1)
    return {k: v.float() for k, v in s.items()}


def _save(config: transformers.LlamaConfig, state: dict, path: Path) -> None:
    model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(state)
    model.save_pretrained(path)


def _logits(path: Path, x: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        return model(x).logits


@pytest.mark.parametrize("symmetry", ["permutation", "orthogonal"])
def test_align_recovers_symmetries_planted_by_hand(make_hf_folder, tmp_path, symmetry) -> None:
    a = make_hf_folder("llama", tmp_path / "a", seed=1)
    config = transformers.AutoConfig.from_pretrained(a)
    assert (config.hidden_size, config.num_attention_heads) == (D_MODEL, HEADS)
    assert (config.num_key_value_heads, config.num_hidden_layers) == (KV_HEADS, LAYERS)
    state = load_hf(a).module.state_dict()
    continuous = symmetry == "orthogonal"
    _save(config, _plant(state, continuous=continuous, seed=7), tmp_path / "b")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        ["align", str(a), str(tmp_path / "b"), "--method", "weight", "--symmetry", symmetry,
         "--out", str(out), "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # the orthogonal form compares with A's norm scales folded, which lmckit writes beside
    reference = load_hf(out / "reference" if continuous else a).params
    aligned, moved = load_hf(out).params, load_hf(tmp_path / "b").params

    def distance(x: dict, y: dict) -> float:
        return float(sum(((x[k].double() - y[k].double()) ** 2).sum() for k in reference))

    assert distance(moved, reference) > 1.0
    assert distance(aligned, reference) / distance(moved, reference) < 1e-8  # squared
    x = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    assert float((_logits(out, x) - _logits(tmp_path / "b", x)).abs().max()) < 1e-4
    meta = json.loads((out / "lmckit.json").read_text())
    assert meta["metadata"]["symmetry"] == symmetry
