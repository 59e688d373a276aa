"""Multi-head latent attention (DeepSeek-V2/V3): each head's query is its position-free
rows of a projection glued to rotary rows, its key the position-free rows of another
glued to one rotary key shared by every head (copied into an empty tensor slice by
slice). The heads' circuits read the position-free parts, so weight matching tells
heads apart whatever basis each head's queries, keys and values sit in; the rotary
embedding, written on the even and odd dims and glued back de-interleaved, leaves the
rotary rows of every head and the shared key's rows one basis: a rotation of each
interleaved plane, alike in every head, beside the head permutation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tests.inference.rules.graphs import seeded, spaces
from tests.planters import distance, orthogonal, rotary_tables
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.groups import Orthogonal, RotaryPlanes
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._params import module_params
from lmckit.symmetry._transform import CircuitPart, Part

HEADS, NOPE, ROPE, VALUE, LATENT, WIDTH, T = 3, 4, 4, 3, 6, 8, 5  # values narrower


def _interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat([even * cos - odd * sin, odd * cos + even * sin], dim=-1)


class LatentAttention(nn.Module):
    """Queries from a latent (``q_b``: per head ``[nope | rope]`` rows), keys and values
    from another (``kv_b``: per head ``[key nope | value]`` rows), the rotary key from
    the last rows of ``kv_a``, as ``modeling_deepseek_v3`` writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.q_a = nn.Linear(WIDTH, LATENT, bias=False)
        self.q_b = nn.Linear(LATENT, HEADS * (NOPE + ROPE), bias=False)
        self.kv_a = nn.Linear(WIDTH, LATENT + ROPE, bias=False)
        self.kv_b = nn.Linear(LATENT, HEADS * (NOPE + VALUE), bias=False)
        self.o = nn.Linear(HEADS * VALUE, WIDTH, bias=False)
        cos, sin = rotary_tables(ROPE, T)
        self.register_buffer("cos", cos[:, : ROPE // 2], persistent=False)
        self.register_buffer("sin", sin[:, : ROPE // 2], persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q = self.q_b(self.q_a(x)).view(b, t, HEADS, NOPE + ROPE).transpose(1, 2)
        q_nope, q_rope = torch.split(q, [NOPE, ROPE], dim=-1)
        latent, k_rope = torch.split(self.kv_a(x), [LATENT, ROPE], dim=-1)
        k_rope = _interleaved(k_rope.view(b, 1, t, ROPE), self.cos, self.sin)
        query = torch.cat((q_nope, _interleaved(q_rope, self.cos, self.sin)), dim=-1)
        kv = self.kv_b(latent).view(b, t, HEADS, NOPE + VALUE).transpose(1, 2)
        k_nope, v = torch.split(kv, [NOPE, VALUE], dim=-1)
        key = kv.new_empty(b, HEADS, t, NOPE + ROPE)
        key[..., :NOPE].copy_(k_nope)
        key[..., NOPE:].copy_(k_rope.expand(-1, HEADS, -1, -1))
        y = F.scaled_dot_product_attention(query, key, v, is_causal=True)
        return x + self.o(y.transpose(1, 2).reshape(b, t, HEADS * VALUE))


def test_latent_heads_get_circuits_of_their_position_free_rows() -> None:
    spec = spaces(seeded(LatentAttention()), torch.randn(2, T, WIDTH))
    circuits = spec["heads.0"].circuits
    assert circuits is not None
    assert circuits.output == "o.weight" and circuits.heads == circuits.kv_heads == HEADS

    def rows(part: CircuitPart, per_head: int, start: int, count: int) -> None:
        got = torch.as_tensor(part.index(HEADS * per_head, HEADS)).flatten().tolist()
        if isinstance(part.index(HEADS * per_head, HEADS), slice):
            got = list(range(HEADS * per_head))[part.index(HEADS * per_head, HEADS)]
        want = [h * per_head + start + i for h in range(HEADS) for i in range(count)]
        assert got == want, part

    assert (circuits.query.param, circuits.key.param) == ("q_b.weight", "kv_b.weight")
    rows(circuits.query, NOPE + ROPE, 0, NOPE)  # each head's position-free query rows
    rows(circuits.key, NOPE + VALUE, 0, NOPE)
    rows(circuits.value, NOPE + VALUE, NOPE, VALUE)


def test_the_shared_rotary_key_is_one_basis_of_interleaved_planes_in_every_head() -> None:
    analysis = analyze_symmetries(seeded(LatentAttention()), (torch.randn(2, T, WIDTH),))
    spec = analysis.spec
    # the strided slices are read as the rotary embedding's planes, not left out
    assert not [line for line in analysis.left_out if "slice" in line], analysis.left_out
    heads, rotary = spec["heads.0"], spec["heads.0.qk"]
    assert rotary.group == RotaryPlanes(ROPE, interleaved=True) and rotary.within == heads.name
    rows = {(u.param, u.parts) for u in rotary.uses}
    per_head = {("q_b.weight", (Part(0, h * (NOPE + ROPE) + NOPE, ROPE),)) for h in range(HEADS)}
    assert rows == per_head | {("kv_a.weight", (Part(0, LATENT, ROPE),))}
    kinds = {s.nest.kind: s.group for s in spec if s.nest is not None}
    assert kinds == {"qk": Orthogonal(), "value": Orthogonal()}
    # the latents (no norm between the projections here: any orthogonal map)
    assert spec["q_a"].group == spec["kv_a"].group == Orthogonal()


def _interleaved_planes(gen: torch.Generator) -> Tensor:
    """A rotation of each plane of dims ``2i, 2i + 1`` (float64)."""
    out = torch.zeros(ROPE, ROPE, dtype=torch.float64)
    for i in range(0, ROPE, 2):
        angle = 2 * torch.pi * float(torch.rand((), generator=gen))
        c, s = torch.cos(torch.tensor(angle)), torch.sin(torch.tensor(angle))
        out[i : i + 2, i : i + 2] = torch.stack([torch.stack([c, -s]), torch.stack([s, c])])
    return out


def _planted(a: dict[str, Tensor], seed: int) -> dict[str, Tensor]:
    """Heads permuted (each head's rotary query rows with it), each head's position-free
    query/key basis and value basis mapped by an orthogonal matrix of its own, the
    shared rotary key's planes rotated (every head's rotary query rows alike), and the
    two latents permuted."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(HEADS, generator=gen)
    q = a["q_b.weight"].double().view(HEADS, NOPE + ROPE, LATENT)[perm].clone()
    kv = a["kv_b.weight"].double().view(HEADS, NOPE + VALUE, LATENT)[perm].clone()
    o = a["o.weight"].double().view(WIDTH, HEADS, VALUE)[:, perm].clone()
    planes = _interleaved_planes(gen)
    kv_a = a["kv_a.weight"].double().clone()
    kv_a[LATENT:] = planes @ kv_a[LATENT:]
    for h in range(HEADS):
        qk, value = orthogonal(NOPE, gen), orthogonal(VALUE, gen)
        q[h, :NOPE], kv[h, :NOPE] = qk @ q[h, :NOPE], qk @ kv[h, :NOPE]
        q[h, NOPE:] = planes @ q[h, NOPE:]
        kv[h, NOPE:], o[:, h] = value @ kv[h, NOPE:], o[:, h] @ value.T
    q_latent, kv_latent = (
        torch.randperm(LATENT, generator=gen),
        torch.randperm(LATENT, generator=gen),
    )
    kv_a[:LATENT] = kv_a[:LATENT][kv_latent]
    moved = {
        "q_a.weight": a["q_a.weight"].double()[q_latent],
        "q_b.weight": q.reshape(-1, LATENT)[:, q_latent],
        "kv_a.weight": kv_a,
        "kv_b.weight": kv.reshape(-1, LATENT)[:, kv_latent],
        "o.weight": o,
    }
    return {**a, **{k: v.reshape(a[k].shape).float() for k, v in moved.items()}}


def test_planted_heads_and_bases_of_latent_attention_are_recovered() -> None:
    module = seeded(LatentAttention())
    x = torch.randn(2, T, WIDTH)
    spec = spaces(module, x)
    a = module_params(module)
    b = _planted(a, seed=3)
    torch.testing.assert_close(  # the planted map is a symmetry
        functional_call(module, b, (x,)), functional_call(module, a, (x,)), atol=1e-5, rtol=0
    )
    moved = weight_matching(spec, a, b, WeightMatchingConfig(max_iter=50)).apply(b)
    assert distance(a, moved) < 1e-4 * distance(a, b)
