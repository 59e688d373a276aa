"""Data split across processes with ``torch.distributed``: shards and sums.

lmckit never starts processes itself. Launch the processes with ``torchrun`` (or any
launcher that initialises the default process group) and call the library as usual;
while the default process group is initialised and has more than one process,

* path evaluation (:func:`lmckit.measure.evaluate`, ``evaluate_path``,
  ``evaluate_along``, :func:`lmckit.paths.evaluate_simplex`) evaluates every ``W``-th
  batch on each of the ``W`` processes and sums loss, metric and counts over them;
* activation statistics (:func:`lmckit.aligners.collect_cross_statistics`, so activation
  matching) stream every ``W``-th input batch and sum the cross-statistics;
* learned matching splits each step's batch into ``W`` row slices and sums the
  gradients, so every process takes the same optimiser step and returns the same
  transform; its validation batches are sharded like path evaluation;
* weight matching solves the spaces of each step of a sweep (spaces that share no
  parameter, :mod:`lmckit.aligners._weight.schedule`) on different processes and
  exchanges the elements, so every process returns the same transform.

Sums, not averages, travel between processes, so the results are those of one process
up to floating-point summation order. Without an initialised process group (or inside
:func:`local`) every function runs on all the data, unchanged. See
``docs/distributed.md`` for how to launch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "any_rank",
    "computed_once",
    "gather_from_ranks",
    "init_from_env",
    "is_distributed",
    "local",
    "rank_rows",
    "shard",
    "sum_gradients",
    "sum_over_ranks",
    "world",
]

T = TypeVar("T")

_ENABLED: ContextVar[bool] = ContextVar("lmckit_distributed", default=True)


def world() -> tuple[int, int]:
    """``(rank, world size)`` lmckit splits its data by: ``(0, 1)`` when not distributed."""
    if not _ENABLED.get() or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def is_distributed() -> bool:
    """Whether lmckit splits data across processes here (initialised, more than one)."""
    return world()[1] > 1


@contextlib.contextmanager
def local() -> Iterator[None]:
    """Run lmckit on all the data in this process, even with a process group (e.g.
    inside your own data-parallel loop, where each process already has its shard)."""
    token = _ENABLED.set(False)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def init_from_env(backend: str | None = None) -> bool:
    """Initialise the default process group from ``torchrun``'s environment.

    Does nothing (and returns ``False``) outside ``torchrun`` (no ``WORLD_SIZE`` in the
    environment) or when the group exists already.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default ``nccl`` when CUDA is available,
            else ``gloo``. With ``nccl`` each process uses GPU ``LOCAL_RANK``.

    Returns:
        Whether lmckit now splits data across processes.
    """
    if "WORLD_SIZE" not in os.environ or not dist.is_available():
        return False
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return is_distributed()


def shard(items: Iterable[T]) -> Iterator[T]:
    """This process's share of ``items``: every ``W``-th, starting at its rank.

    Round robin rather than contiguous blocks: the number of items need not be known,
    and every process draws (and discards) the same sequence, so seeded shuffles stay
    in step.
    """
    rank, size = world()
    for i, item in enumerate(items):
        if i % size == rank:
            yield item


def rank_rows(n: int) -> slice:
    """This process's contiguous slice of the rows ``0..n-1`` of one batch (sizes
    differ by at most one; empty when ``n`` is below the number of processes)."""
    rank, size = world()
    return slice(rank * n // size, (rank + 1) * n // size)


def _reduce_device() -> torch.device:
    # NCCL reduces CUDA tensors only; gloo is given CPU tensors
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sum_over_ranks(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Each tensor summed elementwise over the processes (one collective for all).

    Every process must call this with tensors of the same shapes in the same order.
    The inputs are not modified; the outputs have their dtypes and devices. Not
    distributed: copies of the inputs.
    """
    if not tensors:
        return []
    if not is_distributed():
        return [t.detach().clone() for t in tensors]
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    device = _reduce_device()
    flat = torch.cat([t.detach().reshape(-1).to(device=device, dtype=dtype) for t in tensors])
    dist.all_reduce(flat)
    out, start = [], 0
    for t in tensors:
        out.append(flat[start : start + t.numel()].reshape(t.shape).to(t.device, t.dtype))
        start += t.numel()
    return out


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on some process (all processes must call this)."""
    if not is_distributed():
        return flag
    return bool(sum_over_ranks([torch.tensor([float(flag)])])[0].item() > 0)


def sum_gradients(
    params: Sequence[Tensor], values: Sequence[Tensor] = (), *, mean: bool = False
) -> list[Tensor]:
    """Replace each parameter's ``.grad`` by its sum (or ``mean``) over the processes.

    A missing gradient counts as zeros. ``values`` (e.g. the loss) travel in the same
    collective and come back summed (or averaged). Not distributed: nothing changes.
    Every process must call this with the same parameters in the same order.

    Returns:
        ``values`` summed (averaged) over the processes.
    """
    if not is_distributed():
        return [v.detach() for v in values]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    summed = sum_over_ranks([*grads, *(v.detach() for v in values)])
    scale = 1.0 / world()[1] if mean else 1.0
    for p, g in zip(params, summed, strict=False):
        p.grad = g * scale if mean else g
    return [v * scale if mean else v for v in summed[len(grads) :]]


def gather_from_ranks(value: T) -> list[T]:
    """Every process's ``value`` (any picklable object), in rank order, on every process;
    ``[value]`` when not distributed."""
    _, size = world()
    if size == 1:
        return [value]
    out: list[T] = [value] * size
    dist.all_gather_object(out, value)
    return out


def computed_once(compute: Callable[[], T]) -> T:
    """``compute()`` run by process 0 alone and sent (pickled) to the others, which do
    not run it: for a result every process would compute alike at some cost (reading a
    whole model). An exception it raises is raised on every process. All processes must
    call this together; not distributed: ``compute()``.
    """
    rank, size = world()
    if size == 1:
        return compute()
    box: list[Any] = [None]
    if rank == 0:
        try:
            box[0] = (True, compute())
        except Exception as err:  # every process stops with process 0's error
            box[0] = (False, err)
    dist.broadcast_object_list(box, src=0)
    done, value = box[0]
    if not done:
        raise value
    return value
