"""How an aligner runs: the keyword block every aligner takes, as one value.

Every registered aligner takes ``model``, ``data``, ``seed``, ``progress`` and ``device``
(see :mod:`lmckit.aligners._registry`). Code that runs an aligner it does not know by
name (the workflow, the method comparison, a user's sweep over methods) builds one
:class:`AlignRun` and hands it to :meth:`AlignerInfo.run
<lmckit.aligners.AlignerInfo.run>` instead of forwarding five keywords; the
registry derives the signature it checks from this class, so the block is declared here
and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.data import Dataset

__all__ = ["AlignRun"]


@dataclass(frozen=True)
class AlignRun:
    """The run context of one aligner call (what it runs on and how, not what it computes).

    Attributes:
        model: the ``nn.Module`` both parameter sets run through, for methods that run
            the network; data-free methods ignore it.
        data: a :class:`lmckit.data.Dataset` (its training split) for methods that read
            data (``activation_matching`` also takes an iterable of input batches).
        seed: the method's randomness.
        progress: progress bars on a terminal.
        device: where the heavy tensor work runs; results come back on the CPU.
    """

    model: nn.Module | None = None
    data: Dataset | Iterable[Tensor] | None = None
    seed: int = 0
    progress: bool = False
    device: str | torch.device | None = None

    def keywords(self) -> dict[str, Any]:
        """The context as the keyword arguments an aligner takes."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each keyword's default: what a registered aligner must declare."""
        return {f.name: f.default for f in fields(cls)}
