"""Helpers for tests that start several processes joined in a gloo group."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_rank_environment(rank: int, size: int, port: int) -> None:
    """What ``torchrun`` sets for process ``rank`` of ``size`` on this machine."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(size),
    )
