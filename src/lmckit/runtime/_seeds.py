"""Seeds: the one place an integer seed becomes a ``torch.Generator``, range checked.

``torch.Generator().manual_seed`` takes 64-bit seeds and fails deep inside with an
overflow (or a float's "expected a long") otherwise; :func:`generator` refuses such a
seed in one line, naming the range.
"""

from __future__ import annotations

import torch

__all__ = ["MAX_SEED", "check_seed", "generator"]

#: Largest seed: PyTorch's generators hold 64 bits.
MAX_SEED = 2**64 - 1


def check_seed(seed: object, what: str = "seed") -> int:
    """``seed`` if it is an integer in ``[0, MAX_SEED]``, else a one-line error.

    Raises:
        TypeError: not an integer (a float, a string, ``True``).
        ValueError: negative or beyond 64 bits.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{what} must be an integer, got {seed!r}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{what} must be between 0 and 2**64 - 1, got {seed}")
    return seed


def generator(seed: int | torch.Generator, what: str = "seed") -> torch.Generator:
    """A CPU generator seeded with ``seed`` (checked), or ``seed`` itself if it is one."""
    if isinstance(seed, torch.Generator):
        return seed
    return torch.Generator().manual_seed(check_seed(seed, what))
