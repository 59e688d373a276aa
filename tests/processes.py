"""Helpers for tests that start several processes joined in a gloo group.

The processes meet as ``torchrun``'s do: the launcher (here, the test) hosts the
rendezvous store on a port it holds from before the processes start until they are
done, and every process joins it as a client (``TORCHELASTIC_USE_AGENT_STORE``). A
port is never chosen, released and bound again later, so no other program can take it
in between.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from torch.distributed import TCPStore


@contextlib.contextmanager
def rendezvous(count: int = 1) -> Iterator[list[int]]:
    """``count`` rendezvous stores hosted by this process (one per process group the
    workers will form, as ``torchrun`` makes one per start); yields their ports, held
    until the block ends."""
    stores = [TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
              for _ in range(count)]  # fmt: skip
    try:
        yield [store.port for store in stores]
    finally:
        del stores


def set_rank_environment(rank: int, size: int, port: int) -> None:
    """What ``torchrun`` sets for process ``rank`` of ``size`` on this machine, joining
    the store its launcher hosts on ``port`` (:func:`rendezvous`)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(size),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
