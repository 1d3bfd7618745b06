"""Keep freed memory in the process for the length of a training run (glibc only).

A training step allocates and frees the same large tensors every step: the (N, Vd) logits,
softmaxes and their gradients, tens of MB each. glibc serves any allocation above its mmap
threshold with a fresh ``mmap`` and returns it with ``munmap`` on free, so every step
page-faults those buffers in again, zero-filling each 4 KB page: about a quarter of an
EAGLE-3 step on one core (benchmarks/eagle3-training.md). ``kept_heap`` tells the allocator
to take large blocks from the heap and never trim it, so the second step on reuses pages that
are already mapped; the cost is that the process keeps its peak heap until the block ends.
The same as running under ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...``, scoped to the run.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from contextlib import contextmanager

# mallopt parameters (glibc's malloc.h) and their defaults, restored after the block
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None
    except OSError:
        return None


@contextmanager
def kept_heap():
    """Inside the block, large allocations come from the heap and freed memory stays mapped.
    A no-op where the C library is not glibc (macOS, musl)."""
    libc = _libc()
    if libc is None:
        yield False
        return
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1)
    try:
        yield True
    finally:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
