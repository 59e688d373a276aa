"""The C allocator's setting for large tensors: freed memory goes back to the system.

On Linux, PyTorch's CPU tensors come from glibc's ``malloc``. A block above the mmap
threshold (128 KiB at start) is its own mapping, returned to the system when freed; but
freeing one raises the threshold to that block's size (up to 32 MiB on 64-bit), so later
tensors of that size come from the heap, whose freed space stays resident once it is
fragmented. Aligning large models allocates and frees tensors of tens of MiB for every
space: on a pair of 307M-parameter bfloat16 Llamas (``benchmarks/real_size.py``), the
moving threshold kept about 0.3 GiB resident after weight matching and put the command's
peak at 2.93 GiB instead of 2.69 GiB. :func:`keep_large_blocks_mapped` fixes the
threshold, as ``MALLOC_MMAP_THRESHOLD_`` in the environment would.

The command line calls it once at start; a library user aligning large models may call it
too. Elsewhere (another C library, another system) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["MMAP_THRESHOLD", "keep_large_blocks_mapped"]

#: bytes from which a block is its own mapping (blocks of tensors from 1 MiB on)
MMAP_THRESHOLD = 1 << 20
#: glibc's ``mallopt`` parameter for the mmap threshold (``M_MMAP_THRESHOLD``)
_M_MMAP_THRESHOLD = -3


def keep_large_blocks_mapped(threshold: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of ``threshold`` bytes or more by its own mapping, for the
    rest of the process (see the module docstring).

    Returns:
        Whether the allocator took the setting (False off glibc, or when the
        environment already sets ``MALLOC_MMAP_THRESHOLD_``: the user's choice stays).
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))
