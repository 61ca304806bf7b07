"""Give the memory adaptation frees back to the operating system.

Each candidate and swap allocates and frees gigabytes for a real drafter (the trainer's merged weights in
fp32, the version quantized, the scorer's copy). glibc's malloc serves tensors under its mmap threshold
from heaps it keeps, and the threshold rises with each large block freed, so after a few candidates freed
blocks pile up as fragments the process still holds: on Qwen2.5-Coder-0.5B (rank-8 adapters, 2 threads) a
cycle's resident memory grew from 12 to 17 GB over 8 swaps, and a benchmark's server was killed by the
kernel for it. `malloc_trim(0)` after each decision returns the free pages: 9.2 GB, flat, over the same 8
swaps, at no cost to a step's time. A candidate's making (its merged fp32 weights, the quantization's
temporaries) is trimmed after too: in a real-pair run the server otherwise sat at 12.4 GB instead of 8.9
while the candidate was scored. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


def release_freed_memory() -> bool:
    """Return the heaps' free pages to the operating system; whether any were (False where not glibc)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
