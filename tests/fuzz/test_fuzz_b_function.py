"""B's function checked on B (issue 43, items 1 and 2): pairs where A admits a symmetry B
does not, and modules held in memory that are not one architecture.

The spec is inferred and checked on A. These pairs are built so that A passes that check
for a space B's function forbids: a BLOOM A whose attention output is ~0 (its ALiBi
slopes then do not fix its head order) beside a B whose attention matters, and a module
whose A applies a ReLU where B (same class, another flag) takes a cumulative sum. The
aligned B must compute B's function (within 1e-4 relative), whatever was written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import lmckit
from lmckit.cli import main
from lmckit.formats._io import held_model
from lmckit.plan import plan_alignment
from lmckit.symmetry._params import IncompatibleModelsError

#: the largest relative change of B's outputs an aligned B may show
LIMIT = 1e-4


def _relative(reference: torch.Tensor, other: torch.Tensor) -> float:
    return float((reference - other).abs().max() / reference.abs().max())


# ------------------------------------------------------------------ ALiBi heads (BLOOM)


def _bloom(seed: int, *, quiet_attention: bool) -> nn.Module:
    """A tiny BLOOM; ``quiet_attention``: its attention output scaled to ~1e-9, as a model
    near initialisation whose attention adds almost nothing (every head order then keeps
    its outputs to 1e-5, although ALiBi slopes fix the order of a model that uses them)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BloomConfig(
        vocab_size=61, hidden_size=32, n_layer=2, n_head=4, use_cache=False
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.BloomForCausalLM(config).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.add_(0.1 * torch.randn_like(p))
                if quiet_attention and "self_attention.dense" in name:
                    p.mul_(1e-9)
    return model


def _tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, 9), generator=torch.Generator().manual_seed(5))


def test_alibi_heads_a_admits_are_checked_on_b_in_memory() -> None:
    a, b = _bloom(0, quiet_attention=True), _bloom(1, quiet_attention=False)
    aligned = lmckit.align(a, b)
    x = _tokens()
    with torch.no_grad():
        error = _relative(b(x).logits, aligned.module(x).logits)
    assert error < LIMIT, error
    # the heads' order is either not in the spec (a graph rule knows ALiBi) or left out
    assert all("changes B's outputs" in line for line in aligned.left_out)
    assert all(name not in aligned.result.spaces for name in aligned.transform.elements
               if any(line.startswith(f"{name} (") for line in aligned.left_out))  # fmt: skip


def test_alibi_heads_checked_on_b_by_the_command_line(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    _bloom(0, quiet_attention=True).save_pretrained(tmp_path / "a")
    b = _bloom(1, quiet_attention=False)
    b.save_pretrained(tmp_path / "b")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["align", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    written = transformers.BloomForCausalLM.from_pretrained(out).eval()
    x = _tokens()
    with torch.no_grad():
        assert _relative(b(x).logits, written(x).logits) < LIMIT
    lines = [line for line in result.output.splitlines() if line.startswith("left out: ")]
    assert all("changes B's outputs" in line for line in lines), result.output


# ------------------------------------------------------- another op in the same class


class _Block(nn.Module):
    """Linear, then a ReLU or (``mix=True``) a cumulative sum over the hidden units, then
    Linear: one class, one state dict, two functions."""

    def __init__(self, mix: bool, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.mix = mix
        self.fc1, self.fc2 = nn.Linear(6, 10), nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(h.cumsum(-1) if self.mix else h.relu())


def _x() -> torch.Tensor:
    return torch.randn(16, 6, generator=torch.Generator().manual_seed(1))


def test_another_op_in_b_is_checked_on_b_by_the_workflow() -> None:
    """The plan run on B (what the command line and ``lmckit.align`` run) on a pair whose
    B mixes the hidden units A permutes: the hidden space is left out, B's function kept."""
    with torch.random.fork_rng(devices=[]):
        a, b = _Block(mix=False, seed=0).eval(), _Block(mix=True, seed=1).eval()
    x = _x()
    pair = plan_alignment(held_model(a), example_inputs=(x,)).run(held_model(b))
    moved = lmckit.apply(pair.result.transform.spec, b.state_dict(), pair.result.transform)
    with torch.no_grad():
        out = torch.func.functional_call(b, moved, (x,))
        assert _relative(b(x), out) < LIMIT
    assert any(line.startswith("fc1 (") for line in pair.left_out), pair.left_out
    assert pair.metadata["b_function"]["left_out"] == list(pair.left_out)


# ---------------------------------------------------------- modules held in memory


def _conv(act: nn.Module, seed: int) -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Conv2d(1, 8, 3), act, nn.Conv2d(8, 2, 3)).eval()


def _images() -> torch.Tensor:
    return torch.randn(2, 1, 7, 7, generator=torch.Generator().manual_seed(2))


def test_held_sequential_with_another_module_is_refused() -> None:
    a, b = _conv(nn.ReLU(), 0), _conv(nn.ChannelShuffle(2), 1)
    with pytest.raises(IncompatibleModelsError, match="1 is a ReLU in a and a ChannelShuffle"):
        lmckit.align(a, b, example_inputs=(_images(),))
    assert isinstance(b[1], nn.ChannelShuffle)  # untouched


def test_held_module_of_one_class_with_another_op_is_refused() -> None:
    with torch.random.fork_rng(devices=[]):
        a, b = _Block(mix=False, seed=0).eval(), _Block(mix=True, seed=1).eval()
    with pytest.raises(IncompatibleModelsError, match="traced graphs differ at op .*cumsum"):
        lmckit.align(a, b, example_inputs=(_x(),))


class _Shifted(nn.Module):
    """A linear model adding a buffer the state dict leaves out (non-persistent)."""

    def __init__(self, seed: int, shift: float) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2 = nn.Linear(6, 10), nn.Linear(10, 3)
        self.register_buffer("shift", torch.full((10,), shift), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2((self.fc1(x) + self.shift).relu())


def test_held_modules_whose_unsaved_buffers_differ_are_refused() -> None:
    with torch.random.fork_rng(devices=[]):
        a, b = _Shifted(0, 0.0).eval(), _Shifted(1, 3.0).eval()
    with pytest.raises(IncompatibleModelsError, match="buffer 'shift' is not in the state dict"):
        lmckit.align(a, b, example_inputs=(_x(),))


def test_held_pair_of_one_architecture_still_aligns_and_keeps_b() -> None:
    """A pair that is one architecture is aligned as before; ``Aligned.module`` computes
    B's function."""
    with torch.random.fork_rng(devices=[]):
        a, b = _Shifted(0, 0.5).eval(), _Shifted(1, 0.5).eval()
    aligned = lmckit.align(a, b, example_inputs=(_x(),))
    assert aligned.left_out == ()
    with torch.no_grad():
        assert _relative(b(_x()), aligned.module(_x())) < LIMIT


# --------------------------------------------- the last guard: nothing changes B


class _Twins(nn.Module):
    """Two identical branches; B (``leak``) also reads unit 0 of each hidden layer, so
    that swapping units 0 and 1 changes its outputs a little in each branch, and twice
    as much in both."""

    def __init__(self, leak: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.f1, self.f2 = nn.Linear(5, 4), nn.Linear(5, 4)
        self.g1, self.g2 = nn.Linear(4, 3), nn.Linear(4, 3)
        self.f2.load_state_dict(self.f1.state_dict())
        self.g2.load_state_dict(self.g1.state_dict())
        self.leak = leak

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1, h2 = self.f1(x).relu(), self.f2(x).relu()
        y = self.g1(h1) + self.g2(h2)
        return y + self.leak * (h1[:, :1] + h2[:, :1]) if self.leak else y


def test_spaces_that_keep_b_alone_but_not_together_align_nothing() -> None:
    from lmckit.symmetry._transform import Transform
    from lmckit.workflow._b_function import BFunctionError, check_b_function

    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    with torch.random.fork_rng(devices=[]):
        spec = lmckit.infer_spec(_Twins(0.0), (x,))
        b = _Twins(1e-3).eval()
    assert spec.names == ("f1", "f2")
    swap = torch.tensor([1, 0, 2, 3])
    alone = check_b_function(b, b.state_dict(), Transform(spec, {"f1": swap}), (x,), rtol=1)
    both = Transform(spec, {"f1": swap, "f2": swap})
    # each alone within the limit, both together beyond it
    rtol = 1.5 * alone.error
    with pytest.raises(BFunctionError, match="the aligned B computes another function than B"):
        check_b_function(b, b.state_dict(), both, (x,), rtol=rtol)
