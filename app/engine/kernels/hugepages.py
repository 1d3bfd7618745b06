"""Packed weights in memory backed by 2 MB pages, laid out in the order a forward reads them.

A decode step streams every weight once (~270 MB for SmolLM2-135M in bfloat16). Through 4 KB
pages that is a TLB miss and a page walk every 4 KB, and the hardware prefetcher stops at
each page boundary. Linux backs anonymous memory with 2 MB pages only on request when
transparent huge pages are in "madvise" mode (the common default), so the weights ask:
``madvise(MADV_HUGEPAGE)`` on chunks of anonymous memory, aligned to 2 MB, which weights are
then carved from one after another. Measured on the 2-core dev machine (vanilla decoding,
bfloat16, the same weights in both places, alternated in one process): 11.3 -> 10.0 ms a
token on 1 thread (benchmarks/fast-forward/huge-pages.md).

Only on Linux (``mmap.MADV_HUGEPAGE``) and for weights of at least ``MIN_BYTES``; anything
else gets an ordinary tensor. A chunk's memory is returned when the last weight cut from it
is freed (each weight's tensor keeps its chunk's mapping alive), except the chunk being
filled, which stays mapped for the next weights (at most ``CHUNK`` + 2 MB of address space;
only its written pages hold memory). Why by hand: torch's
allocator offers no page-size control on a CPU.
"""
from __future__ import annotations

import mmap
import threading

import torch

HUGE = 2 << 20                   # bytes in a huge page (x86-64)
CHUNK = 32 << 20                 # bytes mapped at a time; a larger weight gets a chunk of its own size
MIN_BYTES = 256 << 10            # smaller weights (the tests' tiny models) stay ordinary tensors
ALIGN = 4096                     # each weight starts on a page: no weight shares a line with another

_chunk: torch.Tensor | None = None   # (bytes,) uint8 view of the current chunk from its 2 MB boundary
_used = 0
_lock = threading.Lock()


def supported() -> bool:
    return hasattr(mmap, "MADV_HUGEPAGE")


def _new_chunk(nbytes: int) -> torch.Tensor:
    size = max(CHUNK, -(-nbytes // HUGE) * HUGE)
    mapping = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)          # before the first touch: faults then take 2 MB pages
    raw = torch.frombuffer(mapping, dtype=torch.uint8)   # keeps `mapping` alive while any view lives
    start = (-raw.data_ptr()) % HUGE
    return raw[start:start + size]


def empty_like_huge(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``t``'s shape and dtype, on 2 MB pages where this
    system grants them (else an ordinary one)."""
    global _chunk, _used
    nbytes = t.numel() * t.element_size()
    if not supported() or nbytes < MIN_BYTES or t.device.type != "cpu":
        return torch.empty_like(t, memory_format=torch.contiguous_format)
    with _lock:
        if _chunk is None or _used + nbytes > _chunk.numel():
            _chunk, _used = _new_chunk(nbytes), 0
        out = _chunk[_used:_used + nbytes].view(t.dtype).view(t.shape)
        _used += -(-nbytes // ALIGN) * ALIGN
    return out


def to_huge(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a contiguous tensor on 2 MB pages (``empty_like_huge``)."""
    return empty_like_huge(t).copy_(t)
