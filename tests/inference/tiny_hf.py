"""Tiny random ``transformers`` models for the spec tests, and the check that a planted
element is undone.

Models are built from config classes (nothing is downloaded), every weight moved by
``0.1 N(0, 1)`` so that norms and biases are not the trivial ones. Planted elements are
written by the tests themselves, on the Hugging Face parameter names, from each
architecture's own math: never from lmckit's spec.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NamedTuple

import pytest
import torch
from tests.planters import distance
from torch import Tensor, nn
from torch.func import functional_call

import lmckit
from lmckit.hf import example_inputs

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

#: a decoder of two layers, width 32, four query heads sharing two key/value heads
DECODER = dict(
    vocab_size=61,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=37,
    max_position_embeddings=16,
)


def tiny(
    config: str, model: str, *, seed: int = 0, jitter: float = 0.1, **kwargs: Any
) -> nn.Module:
    """``transformers.<model>(transformers.<config>(**kwargs))`` with random weights
    (seeded), each moved by ``jitter * N(0, 1)``; in eval mode."""
    cfg = getattr(transformers, config)(**kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = getattr(transformers, model)(cfg).eval()
        with torch.no_grad():
            for p in module.parameters():
                p.add_(jitter * torch.randn_like(p))
    return module


def params_of(module: nn.Module) -> dict[str, Tensor]:
    """The module's state dict, detached copies."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def outputs(module: nn.Module, params: Mapping[str, Tensor] | None = None) -> Tensor:
    """The module's first output (logits) on its example inputs, at ``params``."""
    args = example_inputs(module)
    with torch.no_grad():
        if params is None:
            out = module(*args)
        else:
            # a tied weight once, under the name the module lists it by
            names = [n for n, _ in module.named_parameters()]
            names += [n for n, _ in module.named_buffers()]
            out = functional_call(module, {n: params[n] for n in names if n in params}, args)
    return out[0] if isinstance(out, tuple) else out.logits


def relative(a: Tensor, b: Tensor) -> float:
    """``max |a - b| / max |a|``."""
    return float((a.double() - b.double()).abs().max() / a.double().abs().max())


class Recovery(NamedTuple):
    """What ``lmckit.align(A, B)`` made of a planted ``B``."""

    before: float  # distance of B's parameters from A's
    after: float  # distance of the aligned B's from A's
    function: float  # relative change of B's logits by the alignment
    aligned: Any  # the lmckit.Aligned


def recover(a: nn.Module, planted: Mapping[str, Tensor], **options: Any) -> Recovery:
    """``lmckit.align(a, b)`` (weight matching, heads as the model has them) where ``b``
    is ``a`` holding ``planted``; how far it brought ``b`` back to ``a``."""
    b = copy.deepcopy(a)
    b.load_state_dict(dict(planted))
    options = {"method": "weight", "circuits": False, **options}
    aligned = lmckit.align(a, b, **options)
    reference = params_of(a)
    # a tied weight is one tensor: counted once, under the name the result has it by
    keys = [k for k in aligned.params if reference[k].is_floating_point()]
    state = a.state_dict()
    assert {state[k].data_ptr() for k in keys} >= {v.data_ptr() for v in state.values()}
    before = distance({k: reference[k] for k in keys}, planted)
    after = distance({k: reference[k] for k in keys}, aligned.params)
    function = relative(outputs(b), outputs(b, aligned.params))
    return Recovery(before, after, function, aligned)
