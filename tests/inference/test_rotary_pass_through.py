"""Partial rotary embeddings with neighbouring dims paired (GPT-J, ``rotary_dim`` 8 of a
head of 16): the dims that pass through unrotated take any orthogonal map, one per head,
applied to its queries and keys alike. They were read as more rotary planes (the group
over the whole head passes the check too, being a part of the true one); the group kept
now is the largest that passes: the planes of the rotary prefix, and an orthogonal block
for the rest.

The plant is written from GPT-J's math (``q = W_q x`` per head, the first ``rotary_dim``
dims rotated pairwise by position, the rest not; the score is ``q . k``): an orthogonal
``R`` on dims ``8:16`` of each head's rows of ``q_proj`` and ``k_proj``.
"""

from __future__ import annotations

import torch
from tests.inference.tiny_hf import outputs, params_of, recover, relative, tiny
from tests.planters import orthogonal

from lmckit.groups import RotaryPlanes
from lmckit.hf import example_inputs
from lmckit.inference import analyze_symmetries

HEADS, HEAD_DIM, ROTARY = 4, 16, 8


def _gptj() -> torch.nn.Module:
    return tiny(
        "GPTJConfig", "GPTJForCausalLM", vocab_size=61, n_embd=HEADS * HEAD_DIM, n_layer=2,
        n_head=HEADS, n_inner=37, rotary_dim=ROTARY, n_positions=16, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip


def _plant_pass_through(params: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = dict(params)
    for layer in range(2):
        q = f"transformer.h.{layer}.attn.q_proj.weight"
        k = f"transformer.h.{layer}.attn.k_proj.weight"
        wq, wk = out[q].clone().double(), out[k].clone().double()
        for h in range(HEADS):
            rows = slice(h * HEAD_DIM + ROTARY, (h + 1) * HEAD_DIM)
            r = orthogonal(HEAD_DIM - ROTARY, gen)
            wq[rows], wk[rows] = r @ wq[rows], r @ wk[rows]
        out[q], out[k] = wq.float(), wk.float()
    return out


def test_the_pass_through_dims_are_an_orthogonal_block_of_their_own() -> None:
    model = _gptj()
    analysis = analyze_symmetries(model, example_inputs(model))
    qk = [s for s in analysis.spec if s.nest is not None and s.nest.kind == "qk"]
    assert len(qk) == 2 * HEADS
    assert {s.group for s in qk} == {RotaryPlanes(ROTARY, interleaved=True)}


def test_align_undoes_a_rotation_of_the_pass_through_dims() -> None:
    model = _gptj()
    planted = _plant_pass_through(params_of(model), seed=3)
    # the plant keeps the function: it is a symmetry whatever lmckit infers
    assert relative(outputs(model), outputs(model, planted)) < 1e-5
    found = recover(model, planted)
    assert found.before > 0.5
    assert found.after / found.before < 1e-4, found
    assert found.function < 1e-5
