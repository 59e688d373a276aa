"""Attention written out by hand (``softmax(q @ k^T / sqrt(d)) @ v``), as research code
and some families write it: its query/key and value bases are named, its heads get
circuits, a rotary query/key basis gets its plane rotations, and a pair planted by hand
(without lmckit's spec) is recovered."""

from __future__ import annotations

import math

import torch
from tests.planters import distance, orthogonal, plane_rotation, rotary_tables, rotate_half
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.groups import Orthogonal, RotaryPlanes
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._params import module_params
from lmckit.symmetry._transform import HeadPermutation

HEADS, HEAD_DIM, T = 3, 4, 6
WIDTH = HEADS * HEAD_DIM


class EagerAttention(nn.Module):
    """``x + proj(softmax(q k^T / sqrt(d) + causal mask) v)``, a fused ``qkv`` split."""

    def __init__(self, rotary: bool) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.rotary = rotary
        cos, sin = rotary_tables(HEAD_DIM, T)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, HEAD_DIM).transpose(1, 2) for z in (q, k, v))
        if self.rotary:
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HEAD_DIM))
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return x + self.proj(y)


def _planted(params: dict[str, Tensor], rotary: bool, seed: int) -> dict[str, Tensor]:
    """Heads permuted; in each head the query/key basis and the value basis rotated."""
    gen = torch.Generator().manual_seed(seed)
    w = params["qkv.weight"].double().view(3, HEADS, HEAD_DIM, WIDTH)
    o = params["proj.weight"].double().view(WIDTH, HEADS, HEAD_DIM)
    perm = torch.randperm(HEADS, generator=gen)
    w, o = w[:, perm], o[:, perm]
    q, k, v, out = [], [], [], []
    for h in range(HEADS):
        qk = plane_rotation(HEAD_DIM, gen) if rotary else orthogonal(HEAD_DIM, gen)
        value = orthogonal(HEAD_DIM, gen)
        q.append(qk @ w[0, h])
        k.append(qk @ w[1, h])
        v.append(value @ w[2, h])
        out.append(o[:, h] @ value.T)
    fused = torch.stack([torch.stack(q), torch.stack(k), torch.stack(v)]).reshape(-1, WIDTH)
    return {
        "qkv.weight": fused.float(),
        "proj.weight": torch.stack(out, 1).reshape(WIDTH, -1).float(),
    }


def test_eager_attention_is_read_as_attention_and_a_planted_pair_recovered() -> None:
    for rotary in (False, True):
        torch.manual_seed(0)
        module = EagerAttention(rotary).eval()
        x = torch.randn(2, T, WIDTH)
        analysis = analyze_symmetries(module, (x,))
        assert len(analysis.attention) == 1, analysis.report()
        spec = analysis.spec
        heads = spec["heads.0"]
        assert isinstance(heads.group, HeadPermutation) and heads.circuits is not None
        qk = RotaryPlanes if rotary else Orthogonal
        kinds = {s.nest.kind: type(s.group) for s in spec if s.nest is not None}
        assert kinds == {"qk": qk, "value": Orthogonal}, analysis.report()

        a = module_params(module)
        b = _planted(a, rotary, seed=1)
        torch.testing.assert_close(  # the planted map is a symmetry
            functional_call(module, b, (x,)), functional_call(module, a, (x,)), atol=1e-5, rtol=0
        )
        moved = weight_matching(spec, a, b, WeightMatchingConfig(max_iter=50)).apply(b)
        assert distance(a, moved) < 1e-4 * distance(a, b), rotary


class Pooling(nn.Module):
    """Softmax weights from a learned query (a parameter), applied to the inputs: not
    attention between two activations."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(1, WIDTH))
        self.out = nn.Linear(WIDTH, 2)

    def forward(self, x: Tensor) -> Tensor:
        weights = (self.query @ x.transpose(-2, -1)).softmax(-1)  # (batch, 1, t)
        return self.out((weights @ x).squeeze(1))


def test_softmax_weights_from_a_parameter_are_not_read_as_attention() -> None:
    analysis = analyze_symmetries(Pooling().eval(), (torch.randn(2, T, WIDTH),))
    assert analysis.attention == ()
