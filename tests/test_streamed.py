"""Points of a path built module by module as the forward pass reaches them."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.measure._batched import Batching
from lmckit.measure._evaluate import evaluate_path
from lmckit.measure._streamed import LinearPoint, streamed_call
from lmckit.symmetry._average import interpolate

transformers = pytest.importorskip("transformers")

STREAM = Batching(mode="loop", stream_bytes=0)  # every point streamed
WHOLE = Batching(mode="loop", stream_bytes=2**62)  # every point built whole


def _llama_pair() -> tuple[nn.Module, dict[str, Tensor], dict[str, Tensor]]:
    config = transformers.LlamaConfig(
        vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=16,
        tie_word_embeddings=False, use_cache=False,
    )  # fmt: skip
    pair = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        module = transformers.LlamaForCausalLM(config).eval()
        pair.append({k: v.to(torch.bfloat16) for k, v in module.state_dict().items()})
    return module, pair[0], pair[1]


def _tokens(seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, 61, (4, 16), generator=gen), torch.randint(0, 61, (4, 16), generator=gen))
        for _ in range(3)
    ]


def _logits(out: object) -> Tensor:
    return out.logits if hasattr(out, "logits") else out  # type: ignore[attr-defined]


def test_a_linear_point_reads_as_interpolate_builds_it() -> None:
    _, a, b = _llama_pair()
    lazy = LinearPoint(a, b, 0.3, torch.float32)
    whole = interpolate(a, b, 0.3, dtype=torch.float32)
    assert list(lazy) == list(whole)
    for k in whole:
        assert torch.equal(lazy[k], whole[k]), k
    assert lazy.nbytes() == sum(v.numel() * v.element_size() for v in whole.values())


def test_streamed_call_computes_the_whole_points_function_and_restores_the_module() -> None:
    module, a, b = _llama_pair()
    own = {k: v for k, v in module.state_dict(keep_vars=True).items()}
    lazy = LinearPoint(a, b, 0.5, torch.float32)
    x = _tokens()[0][0]
    with torch.no_grad():
        got = _logits(streamed_call(module, lazy, x))
        want = _logits(functional_call(module, dict(lazy), (x,)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    after = module.state_dict(keep_vars=True)
    assert all(after[k] is v for k, v in own.items())  # the module's own tensors are back


def test_only_the_running_modules_part_of_the_point_is_built() -> None:
    module, a, b = _llama_pair()
    lazy = LinearPoint(a, b, 0.5, torch.float32)
    built_sizes: list[int] = []

    def count(_m: nn.Module, _args: object, _out: object) -> None:
        # registered first, this runs before lmckit's hook takes the module's part out
        built_sizes.append(sum(p.numel() for p in module.parameters()))

    leaves = [m for m in module.modules() if not list(m.children()) and list(m.parameters())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            streamed_call(module, lazy, _tokens()[0][0])
    finally:
        for h in handles:
            h.remove()
    largest_module = max(sum(p.numel() for p in m.parameters()) for m in leaves)
    total = sum(v.numel() for v in a.values() if v.is_floating_point())
    assert len(built_sizes) >= len(leaves) and min(built_sizes) > 0
    assert max(built_sizes) <= largest_module < total // 4


def test_a_streamed_path_gives_the_same_numbers_as_whole_points() -> None:
    module, a, b = _llama_pair()

    def task_batches() -> list[tuple[Tensor, Tensor]]:
        return _tokens()

    class Causal(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Tensor) -> Tensor:
            return self.inner(x).logits

    wrapped = Causal(module)
    pa = {f"inner.{k}": v for k, v in a.items()}
    pb = {f"inner.{k}": v for k, v in b.items()}
    kw = dict(points=5, dtype=torch.float32)
    streamed = evaluate_path(wrapped, pa, pb, task_batches, batching=STREAM, **kw)
    whole = evaluate_path(wrapped, pa, pb, task_batches, batching=WHOLE, **kw)
    assert streamed.loss == whole.loss and streamed.acc == whole.acc


class ParentReadsChild(nn.Module):
    """The output layer uses the embedding's weight from the parent's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.hidden = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.hidden(self.embed(x)))
        return h @ self.embed.weight  # a weight read outside its module


def test_a_module_reading_anothers_weight_fails_streamed_and_the_path_builds_points_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ParentReadsChild().eval()
    torch.manual_seed(0)
    a = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    b = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    x = torch.randn(5, 6)
    with pytest.raises(RuntimeError):  # the empty stand-in, never a wrong weight
        streamed_call(model, LinearPoint(a, b, 0.5, None), x)
    data = [(x, torch.randint(0, 6, (5,)))]
    with caplog.at_level(logging.INFO, logger="lmckit.measure._batched"):
        streamed = evaluate_path(model, a, b, data, points=3, batching=STREAM)
    assert "building each point whole" in caplog.text
    whole = evaluate_path(model, a, b, data, points=3, batching=WHOLE)
    assert streamed.loss == whole.loss


def test_stream_bytes_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="stream_bytes"):
        Batching(stream_bytes=-1)
