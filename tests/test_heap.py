"""``kept_heap``: inside it, a step that allocates and frees the same large buffers stops
page-faulting them in again (what makes it worth a quarter of an EAGLE-3 training step)."""
from __future__ import annotations

import resource

import pytest
import torch

from app.train.heap import _libc, kept_heap


def _step_faults(steps: int = 8) -> list[int]:
    """Minor page faults of each of ``steps`` steps shaped like a loss over (N, V) logits."""
    out = []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        logits = torch.randn(4096, 2048)                       # 32 MB, above glibc's mmap threshold
        loss = (torch.log_softmax(logits, -1) * logits).sum()
        del logits, loss
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return out


@pytest.mark.skipif(_libc() is None, reason="glibc only")
def test_inside_kept_heap_the_large_buffers_of_a_step_are_reused():
    with kept_heap() as active:
        faults = _step_faults()
    assert active
    pages = 2 * 4096 * 2048 * 4 // 4096                         # the step's two buffers, in 4 KB pages
    assert sum(faults[-3:]) < pages // 4, faults                  # a step touched its buffers again without faulting
