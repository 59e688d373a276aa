"""Head circuits with grouped-query attention: the similarities against dense circuits
and autograd (key/value heads are shared by their group's query heads, and computed once
per key/value head)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from lmckit.aligners._weight.circuits import (
    head_circuits,
    head_similarity,
    residual_circuit_similarity,
)
from lmckit.aligners._weight.objective import space_objective, space_objectives
from lmckit.forms._recipe import AlignForm, aligned_form
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import module_params
from lmckit.symmetry._transform import Space

HEADS, KV_HEADS, HIDDEN = 6, 2, 24


def _llama_form(layers: int, *, bias: bool, change: Callable[[Tensor], Tensor]) -> AlignForm:
    """Two GQA Llamas of random weights (seeds 0 and 1, each weight passed through
    ``change``) in the orthogonal form."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=11, hidden_size=HIDDEN, intermediate_size=16, num_hidden_layers=layers,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, attention_bias=bias,
        tie_word_embeddings=False, use_cache=False,
    )  # fmt: skip
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        module = transformers.LlamaForCausalLM(config).eval()
        models.append({k: change(v) for k, v in module_params(module).items()})
    return aligned_form(module, models[0], models[1], symmetry="orthogonal")


@pytest.fixture(scope="module")
def pair() -> tuple[Space, dict[str, Tensor], dict[str, Tensor]]:
    """The key/value-group space of a GQA Llama layer, and two random models (biases
    on the projections, so the augmented column counts too)."""
    form = _llama_form(1, bias=True, change=lambda v: v + 0.1 * torch.randn_like(v))
    spaces = [s for s in form.spec if s.circuits is not None and s.nest is None]
    assert spaces and spaces[0].circuits is not None
    assert (spaces[0].circuits.heads, spaces[0].circuits.kv_heads) == (HEADS, KV_HEADS)
    return spaces[0], dict(form.a), dict(form.b)


def test_head_similarity_is_the_inner_product_of_dense_circuits(pair) -> None:
    space, a, b = pair
    (qk_a, ov_a), (qk_b, ov_b) = head_circuits(a, space), head_circuits(b, space)
    want = torch.einsum("ixy,jxy->ij", qk_a.double(), qk_b.double()) + torch.einsum(
        "ixy,jxy->ij", ov_a.double(), ov_b.double()
    )
    torch.testing.assert_close(head_similarity(space, a, b).double(), want, rtol=1e-4, atol=1e-5)
    # a range of query heads that starts inside one group and ends inside the next
    rows = slice(2, 5)
    got = head_similarity(space, a, b, heads=rows).double()
    torch.testing.assert_close(got, want[rows, rows], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("inputs", "outputs"), [(True, True), (True, False), (False, True)])
def test_residual_circuit_similarity_is_the_gradient_of_the_circuit_objective(
    pair, inputs: bool, outputs: bool
) -> None:
    space, a, b = pair
    (qk_a, ov_a), (qk_b, ov_b) = head_circuits(a, space), head_circuits(b, space)
    gen = torch.Generator().manual_seed(3)
    current, _ = torch.linalg.qr(torch.randn(HIDDEN, HIDDEN, generator=gen, dtype=torch.float64))
    t = current.clone().requires_grad_(True)
    eye = torch.eye(HIDDEN, dtype=torch.float64)
    t_in = torch.block_diag(t if inputs else eye, torch.ones(1, 1, dtype=torch.float64))
    t_out = t if outputs else eye
    qk = t_in @ qk_b.double() @ t_in.T
    ov = t_out @ ov_b.double() @ t_in.T
    objective = (qk_a.double() * qk).sum() + (ov_a.double() * ov).sum()
    (want,) = torch.autograd.grad(objective, t)
    got = residual_circuit_similarity(
        space, a, b, current.float(), inputs=inputs, outputs=outputs
    ).double()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@pytest.mark.parametrize("reading", [(True, False, False), (False, True, True)])
def test_residual_circuit_similarity_of_a_space_some_projections_read(
    pair, reading: tuple[bool, bool, bool]
) -> None:
    # a latent of multi-head latent attention feeds the queries alone, or the keys and
    # values: the map turns only the inputs of the projections that read it
    space, a, b = pair
    (qk_a, ov_a), (qk_b, ov_b) = head_circuits(a, space), head_circuits(b, space)
    gen = torch.Generator().manual_seed(5)
    current, _ = torch.linalg.qr(torch.randn(HIDDEN, HIDDEN, generator=gen, dtype=torch.float64))
    t = current.clone().requires_grad_(True)
    one, eye = torch.ones(1, 1, dtype=torch.float64), torch.eye(HIDDEN, dtype=torch.float64)
    t_q, t_k, t_v = (torch.block_diag(t if r else eye, one) for r in reading)
    qk = t_q @ qk_b.double() @ t_k.T
    ov = ov_b.double() @ t_v.T
    objective = (qk_a.double() * qk).sum() + (ov_a.double() * ov).sum()
    (want,) = torch.autograd.grad(objective, t)
    got = residual_circuit_similarity(
        space, a, b, current.float(), inputs=reading, outputs=False
    ).double()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_objectives_of_head_spaces_moved_once_match_each_space_solved_alone() -> None:
    # space_objectives moves a layer's projections once by the whole transform; each
    # space's own subproblem (space_objective) moves them by every other space
    # weights of order one: circuits are products of four of them
    form = _llama_form(2, bias=False, change=lambda v: 10 * v)
    a, b = dict(form.a), dict(form.b)
    transform = random_transform(form.spec, 4)
    names = form.spec.names
    heads = [n for n in names if form.spec[n].circuits is not None]
    assert len(heads) >= 2 * (1 + KV_HEADS)  # groups and query heads within them, per layer
    got = space_objectives(form.spec, names, a, b, transform)
    for name in names:
        want = space_objective(form.spec, form.spec[name], a, b, transform)
        assert got[name] == pytest.approx(want, rel=1e-4, abs=1e-6), name
        assert abs(want) > 1e-2, name
