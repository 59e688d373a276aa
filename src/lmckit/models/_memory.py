"""The memory a training run needs, counted on the meta device before anything is allocated.

:func:`training_memory` builds the model of a config on the meta device (shapes only)
and runs one training batch through it there, recording what autograd saves for the
backward pass, so nothing of the size the config claims is ever allocated. The peak of
:func:`lmckit.training.fit` with its built-in optimisers is then, in bytes::

    5 * parameters + 3 * largest tensor + buffers + activations + 64 MiB

- five state-dict-sized copies: the module built from the seed (kept as the template
  the result is saved with), the training copy, its gradients and two optimiser
  moments (Adam; SGD's momentum buffer is one);
- three copies of the largest tensor: the temporaries of one parameter's optimiser
  step (Adam's ``sqrt(v)``, its quotient, and the gradient plus weight decay);
- buffers outside the state dict (non-persistent: masks, position tables);
- activations: twice what autograd saves for one batch, and the logits (the gradients
  flowing back are at most as large again);
- 64 MiB for what PyTorch and the allocator hold beyond the tensors.

Measured peaks (resident memory, ``/proc/self/status`` ``VmHWM``) of ``train_model``
on this formula are listed in ``docs/reliability.md``; the formula is above every one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lmckit.models import _sizing as sizing
from lmckit.models._registry import ModelConfig, ZooModel
from lmckit.training._task import predictions

__all__ = ["TrainingMemory", "check_training_fits", "training_memory"]

#: State-dict-sized copies a training run holds at its peak (see the module docstring).
STATE_COPIES = 5
#: Copies of the largest tensor the optimiser's step makes for it.
STEP_TEMPORARIES = 3
#: What PyTorch and the allocator hold beyond the tensors (measured: up to 40 MiB).
OVERHEAD = 64 * 2**20


@dataclass(frozen=True)
class TrainingMemory:
    """The bytes one training run needs, by what holds them.

    Attributes:
        values: the values of the state dict (parameters and persistent buffers).
        parameters: one float32 state dict, in bytes (so are the others).
        largest: its largest tensor.
        buffers: buffers outside the state dict (non-persistent ones).
        activations: what one training batch holds for the backward pass.
        batch_size: the batch the activations were counted for.
    """

    values: int
    parameters: int
    largest: int
    buffers: int
    activations: int
    batch_size: int

    @property
    def total(self) -> int:
        """The peak: state-dict copies, step temporaries, buffers and activations."""
        return (
            STATE_COPIES * self.parameters
            + STEP_TEMPORARIES * self.largest
            + self.buffers
            + self.activations
            + OVERHEAD
        )


def _non_persistent_buffers(module: ZooModel) -> int:
    in_state = {id(t) for t in module.state_dict(keep_vars=True).values()}
    return sum(_nbytes(b) for b in module.buffers() if id(b) not in in_state)


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _activation_bytes(module: ZooModel, input_shape: tuple[int, ...], tokens: bool,
                      batch_size: int) -> int:  # fmt: skip
    """Twice the bytes autograd saves for one batch and its logits (parameters and
    their views left out: they are counted already); counted on ``module``, a
    meta-device model, so nothing is allocated."""
    own = {id(p) for p in module.parameters()}
    saved: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        base = t._base if t._base is not None else t
        if id(t) not in own and id(base) not in own:
            saved[id(t)] = _nbytes(t)
        return t

    shape = (batch_size, *input_shape)
    x = torch.zeros(shape, dtype=torch.long if tokens else torch.float32, device="meta")
    y = torch.zeros(shape if tokens else shape[:1], dtype=torch.long, device="meta")
    module.train()
    try:
        with (
            torch.random.fork_rng(devices=[]),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        ):
            out = predictions(module(x))
            F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    except (RuntimeError, ValueError, IndexError, TypeError, NotImplementedError):
        # data that does not fit the model: the data check after this names it
        return 0
    # the gradients flowing back through them are at most as large again (measured: the
    # peak beyond the state copies reached 1.95 times what is saved, ResNet20 x4 with a
    # batch of 512; benchmarks/training_memory.py)
    return 2 * (sum(saved.values()) + _nbytes(out))


def training_memory(
    config: ModelConfig, *, input_shape: tuple[int, ...], tokens: bool, batch_size: int
) -> TrainingMemory:
    """What training ``config`` on batches of ``batch_size`` inputs of ``input_shape``
    needs (token ids when ``tokens``), counted without allocating.

    Raises:
        ValueError: the config cannot be built.
    """
    module = sizing.meta_model(config)
    state = [t.float() if t.is_floating_point() else t for t in module.state_dict().values()]
    return TrainingMemory(
        values=sum(t.numel() for t in state),
        parameters=sum(_nbytes(t) for t in state),
        largest=max((_nbytes(t) for t in state), default=0),
        buffers=_non_persistent_buffers(module),
        activations=_activation_bytes(module, tuple(input_shape), tokens, batch_size),
        batch_size=batch_size,
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_training_fits(
    config: ModelConfig,
    *,
    input_shape: tuple[int, ...],
    tokens: bool,
    batch_size: int,
    limit_bytes: int | None = None,
) -> TrainingMemory:
    """Refuse to train ``config`` when its peak (:class:`TrainingMemory`) exceeds the
    memory available, before anything is allocated; return the count.

    Args:
        config: the architecture.
        input_shape, tokens, batch_size: one training batch (its inputs' shape without
            the batch axis, whether they are token ids, its size).
        limit_bytes: the budget; ``None``: the memory this machine has available.

    Raises:
        ValueError: in one line, the bytes needed (and what holds them) and the budget.
    """
    need = training_memory(config, input_shape=input_shape, tokens=tokens, batch_size=batch_size)
    budget = sizing.memory_bytes() if limit_bytes is None else limit_bytes
    if budget is not None and need.total > budget:
        raise ValueError(
            f"training {config.name} needs about {_gib(need.total)} ({need.values:,} "
            f"values, {_gib(need.parameters)} per copy: weights, training copy, "
            f"gradients, two optimiser moments and step temporaries; activations of a batch "
            f"of {batch_size}: {_gib(need.activations)}), more than the {_gib(budget)} "
            "available; choose smaller sizes"
        )
    return need
