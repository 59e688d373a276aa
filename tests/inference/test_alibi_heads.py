"""ALiBi: a slope per head added to the scores fixes the order of the heads, and the graph
says so (a table of constants that differs from head to head meets the scores), whatever
the weights. The bases inside each head are still symmetries: with the head permutation
left out they stay, one space per head.

Before, the order was left out only because a random permutation failed the check on
A's weights; with A near its initialisation (attention contributing little) the check
passed, and ``align`` reordered B's heads, changing B's function (issue 43).

The plant is written from BLOOM's math: the fused projection is viewed
``(heads, 3, head_dim)``; per head, an orthogonal ``V`` on its value rows (and bias),
undone on its columns of ``dense``, and an orthogonal ``Q`` on its query and key rows (and
biases): ``(Q q) . (Q k) = q . k``.
"""

from __future__ import annotations

import torch
from tests.inference.tiny_hf import outputs, params_of, recover, relative, tiny
from tests.planters import orthogonal

from lmckit.hf import example_inputs
from lmckit.inference import analyze_symmetries

HEADS, HEAD_DIM = 4, 8


def _bloom(seed: int = 0, jitter: float = 0.1) -> torch.nn.Module:
    return tiny(
        "BloomConfig", "BloomForCausalLM", vocab_size=61, hidden_size=HEADS * HEAD_DIM,
        n_layer=2, n_head=HEADS, seed=seed, jitter=jitter,
    )  # fmt: skip


def test_the_graph_fixes_the_order_of_heads_with_per_head_slopes() -> None:
    model = _bloom()
    # no check of the function: the rule is read off the graph alone
    analysis = analyze_symmetries(model, example_inputs(model), check=False, decide=False)
    assert not any(s.group.units(s.n) == HEADS for s in analysis.spec)
    for layer in (0, 1):
        line = next(x for x in analysis.left_out if x.startswith(f"heads.{layer} ("))
        assert "fixed by a constant that differs from head to head" in line
        for kind in ("qk", "value"):
            where = [(s, s.inside) for s in analysis.spec if s.inside is not None]
            inside = [s for s, at in where if at.parent == f"heads.{layer}" and at.kind == kind]
            assert sorted(s.inside.unit for s in inside if s.inside) == list(range(HEADS))
            assert all(s.nest is None and s.enclosed for s in inside)


def _rows(head: int, block: int) -> slice:
    start = head * 3 * HEAD_DIM + block * HEAD_DIM
    return slice(start, start + HEAD_DIM)


def _plant_bases(params: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = dict(params)
    for layer in range(2):
        attn = f"transformer.h.{layer}.self_attention"
        w = out[f"{attn}.query_key_value.weight"].clone().double()
        b = out[f"{attn}.query_key_value.bias"].clone().double()
        dense = out[f"{attn}.dense.weight"].clone().double()
        for h in range(HEADS):
            v, q = orthogonal(HEAD_DIM, gen), orthogonal(HEAD_DIM, gen)
            for block, m in ((0, q), (1, q), (2, v)):
                w[_rows(h, block)] = m @ w[_rows(h, block)]
                b[_rows(h, block)] = m @ b[_rows(h, block)]
            cols = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
            dense[:, cols] = dense[:, cols] @ v.T
        out[f"{attn}.query_key_value.weight"] = w.float()
        out[f"{attn}.query_key_value.bias"] = b.float()
        out[f"{attn}.dense.weight"] = dense.float()
    return out


def test_align_undoes_the_bases_inside_each_head() -> None:
    model = _bloom()
    planted = _plant_bases(params_of(model), seed=2)
    assert relative(outputs(model), outputs(model, planted)) < 1e-5
    found = recover(model, planted)
    assert found.before > 0.5
    assert found.after / found.before < 1e-4, found
    assert found.function < 1e-5


def test_align_never_reorders_the_heads_of_b_when_a_is_near_its_initialisation() -> None:
    a = _bloom()
    with torch.no_grad():  # A's attention adds next to nothing: a check on A cannot see
        for layer in a.transformer.h:  # that the slopes fix the heads' order
            layer.self_attention.dense.weight.mul_(1e-7)
            layer.self_attention.dense.bias.mul_(1e-7)
    b = _bloom(seed=1)
    found = recover(a, params_of(b))
    assert found.function < 1e-5, found.function
