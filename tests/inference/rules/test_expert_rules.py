"""Experts (:mod:`lmckit.inference._layers` grouped products, :mod:`lmckit.inference._experts`): a
mixture's stacked expert weights, the router found behind its top-k (through a
per-expert bias added to the scores and the mask of group-limited routing), and the
permutations a check keeps."""

from __future__ import annotations

import torch
import transformers.integrations.moe  # noqa: F401  (registers transformers::grouped_mm_fallback)
from tests.inference.rules.graphs import Level, interpreted, param_axis
from torch import Tensor, nn

from lmckit.groups import Permutation
from lmckit.inference import analyze_symmetries

EXPERTS, WIDTH, UNITS = 4, 8, 8


class Mixture(nn.Module):
    """Each token through its best expert, tokens sorted by expert and multiplied segment
    by segment; the router adds a per-expert correction bias before ranking (DeepSeek),
    and with ``groups > 1`` ranks only the experts of the group whose scores sum highest."""

    def __init__(self, groups: int = 1) -> None:
        super().__init__()
        self.groups = groups
        self.embed, self.out = nn.Linear(3, WIDTH), nn.Linear(WIDTH, 2)
        self.router = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.register_buffer("correction", torch.zeros(EXPERTS))
        self.up = nn.Parameter(torch.randn(EXPERTS, UNITS, WIDTH) * 0.3)
        self.down = nn.Parameter(torch.randn(EXPERTS, WIDTH, UNITS) * 0.3)

    def _choice(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        scores = self.router(tokens).sigmoid()
        choice = scores + self.correction
        if self.groups > 1:
            size = EXPERTS // self.groups
            best = choice.view(-1, self.groups, size).sum(-1).topk(1, dim=-1)[1]
            mask = torch.zeros(tokens.shape[0], self.groups).scatter_(1, best, 1.0)
            mask = mask[:, :, None].expand(-1, self.groups, size).reshape(-1, EXPERTS)
            choice = choice.masked_fill(mask == 0, float("-inf"))
        index = choice.topk(1, dim=-1)[1].reshape(-1)
        return index, scores.gather(1, index[:, None])

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.embed(x).reshape(-1, WIDTH)
        index, weight = self._choice(tokens)
        sorted_ids, order = torch.sort(index)
        counts = torch.histc(sorted_ids.float(), bins=EXPERTS, min=0, max=EXPERTS - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        grouped = torch.ops.transformers.grouped_mm_fallback
        hidden = torch.relu(grouped(tokens[order], self.up.transpose(-1, -2), offsets))
        mixed = grouped(hidden, self.down.transpose(-1, -2), offsets) * weight[order]
        back = torch.empty_like(order)
        back[order] = torch.arange(order.shape[0])
        return self.out(mixed[back].reshape(*x.shape[:-1], WIDTH))


def _mixture(groups: int = 1) -> Mixture:
    torch.manual_seed(0)
    module = Mixture(groups).eval()
    module.correction.copy_(0.2 * torch.randn(EXPERTS))
    return module


def test_a_grouped_product_reads_the_stream_and_leaves_the_experts_to_a_check() -> None:
    an = interpreted(_mixture(), torch.randn(2, 5, 3))
    assert param_axis(an, "up", 0).level == Level.FREE  # chosen by the router
    assert param_axis(an, "up", 2) is param_axis(an, "embed.weight", 0)  # reads the stream
    assert [(site.weight, site.node) for site in an.experts] == [
        ("up", "grouped_mm_fallback"),
        ("down", "grouped_mm_fallback_1"),
    ]


def test_experts_move_with_their_router_and_its_correction_bias() -> None:
    analysis = analyze_symmetries(_mixture(), torch.randn(2, 5, 3))
    experts = analysis.spec["experts.0"]
    assert experts.group == Permutation()
    assert {(u.param, u.axis) for u in experts.uses} == {
        ("router.weight", 0), ("correction", 0), ("up", 0), ("down", 0)
    }  # fmt: skip
    assert len(analysis.spec.nested_in("experts.0")) == EXPERTS  # the units of each
    assert not any("topk" in note for note in analysis.left_out)


def test_group_limited_routing_keeps_the_permutations_that_map_groups_onto_groups() -> None:
    analysis = analyze_symmetries(_mixture(groups=2), torch.randn(2, 5, 3))
    assert analysis.spec["experts.0"].group == Permutation(blocks=2)
    assert not any("topk" in note for note in analysis.left_out)
