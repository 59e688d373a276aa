"""Freed large tensors go back to the system once the allocator's threshold is fixed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from lmckit.runtime._allocator import keep_large_blocks_mapped

#: allocates 40 blocks of 8 MiB after one was mapped and freed (glibc then serves that
#: size from the heap), frees all but the last, and prints the MiB still resident
_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from lmckit.runtime._allocator import keep_large_blocks_mapped
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    if sys.argv[1] == "fixed":
        assert keep_large_blocks_mapped()
    x = torch.ones(2 << 20)
    del x
    base = rss()
    blocks = [torch.ones(2 << 20) for _ in range(40)]
    last = blocks[-1]
    del blocks
    print((rss() - base) / 2**20)
    """
)


def _retained(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_leave_the_process_with_the_threshold_fixed() -> None:
    # 40 x 8 MiB allocated, 39 freed: with the threshold fixed only the kept block stays
    # resident (8 MiB); with glibc's moving threshold the freed heap stays (320 MiB measured)
    assert _retained("fixed") < 32
    assert _retained("moving") > 160


def test_the_environment_setting_is_left_to_the_user(monkeypatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "4096")
    assert keep_large_blocks_mapped() is False
