"""Gemma 2 caps its attention scores (``c tanh(s / c)`` before the softmax) and writes the
attention out by hand. The scores still come from ``q k^T``, so the heads' query/key
basis is a symmetry up to what rotary positions allow (a rotation of each plane); the
walk from the product to the softmax now reads through functions of each score.

The plant is written from Gemma 2's math: per key/value group, one rotation of each
rotary plane (dims ``i`` and ``i + d/2``) applied to the rows of its key head and of every
query head of the group; ``(R q) . (R k) = q . k`` and ``R`` commutes with the positions.
"""

from __future__ import annotations

import torch
from tests.inference.tiny_hf import DECODER, outputs, params_of, recover, relative, tiny
from tests.planters import plane_rotation

from lmckit.groups import RotaryPlanes
from lmckit.hf import example_inputs
from lmckit.inference import analyze_symmetries

HEAD_DIM, GROUPS, PER_GROUP = 8, 2, 2


def _gemma2() -> torch.nn.Module:
    return tiny("Gemma2Config", "Gemma2ForCausalLM", **DECODER, head_dim=HEAD_DIM, sliding_window=4)


def test_the_query_key_basis_of_soft_capped_heads_is_found() -> None:
    model = _gemma2()
    analysis = analyze_symmetries(model, example_inputs(model))
    qk = [s for s in analysis.spec if s.nest is not None and s.nest.kind == "qk"]
    assert len(qk) == 2 * GROUPS and {s.group for s in qk} == {RotaryPlanes(HEAD_DIM)}


def _plant_planes(params: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = dict(params)
    for layer in range(2):
        q = f"model.layers.{layer}.self_attn.q_proj.weight"
        k = f"model.layers.{layer}.self_attn.k_proj.weight"
        wq, wk = out[q].clone().double(), out[k].clone().double()
        for g in range(GROUPS):
            r = plane_rotation(HEAD_DIM, gen)
            rows = slice(g * HEAD_DIM, (g + 1) * HEAD_DIM)
            wk[rows] = r @ wk[rows]
            for j in range(PER_GROUP):
                head = g * PER_GROUP + j
                rows = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)
                wq[rows] = r @ wq[rows]
        out[q], out[k] = wq.float(), wk.float()
    return out


def test_align_undoes_rotations_of_the_rotary_planes() -> None:
    model = _gemma2()
    planted = _plant_planes(params_of(model), seed=11)
    assert relative(outputs(model), outputs(model, planted)) < 1e-5
    found = recover(model, planted)
    assert found.before > 0.5
    assert found.after / found.before < 1e-4, found
    assert found.function < 1e-5
