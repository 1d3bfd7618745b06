"""Packed weights on 2 MB pages (app/engine/kernels/hugepages.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.engine.kernels import hugepages


def _thp_mode() -> str | None:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists():
        return None
    text = path.read_text()
    return text[text.index("[") + 1:text.index("]")]


def test_weights_are_copied_exactly_one_after_another_on_page_boundaries(monkeypatch):
    monkeypatch.setattr(hugepages, "_chunk", None)          # a fresh chunk for this test's weights
    a = torch.randn(700, 512)                                # 1.4 MB: over MIN_BYTES
    b = torch.randn(300, 512).to(torch.bfloat16).t()         # non-contiguous: copied into a contiguous layout
    ha, hb = hugepages.to_huge(a), hugepages.to_huge(b)
    assert torch.equal(ha, a) and torch.equal(hb, b) and ha.is_contiguous() and hb.is_contiguous()
    small = torch.randn(16, 16)
    hs = hugepages.to_huge(small)
    assert torch.equal(hs, small) and hs.untyped_storage().nbytes() == small.numel() * 4   # an ordinary tensor
    if not hugepages.supported():
        pytest.skip("no MADV_HUGEPAGE on this system: ordinary tensors")
    assert ha.data_ptr() % hugepages.HUGE == 0                            # a chunk starts on a 2 MB page
    step = -(-a.numel() * 4 // hugepages.ALIGN) * hugepages.ALIGN
    assert hb.data_ptr() == ha.data_ptr() + step                         # the next weight right after, page-aligned


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off here")
def test_the_weights_get_huge_pages():
    """The weights' memory asks the kernel for 2 MB pages: every mapping they lie in carries
    MADV_HUGEPAGE (``hg`` in /proc/self/smaps' VmFlags). Whether the kernel can grant them at
    that moment depends on how fragmented the host's memory is (a busy CI machine once had
    only 4 MB to give), so the grant itself is measured in benchmarks/fast-forward/huge-pages.md,
    not asserted here."""
    smaps = Path("/proc/self/smaps")
    if not smaps.exists() or not hugepages.supported():
        pytest.skip("no /proc/self/smaps or no MADV_HUGEPAGE")
    weights = [hugepages.to_huge(torch.ones(1 << 20)) for _ in range(8)]   # 8 x 4 MB
    assert all(bool((w == 1).all()) for w in weights)
    flags, region = {}, None
    for line in smaps.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):                      # "start-end perms ...": a new mapping
            start, end = (int(x, 16) for x in head.split("-"))
            region = (start, end)
        elif head == "VmFlags:":
            flags[region] = set(line.split()[1:])
    for w in weights:
        ptr = w.data_ptr()
        owner = [f for (start, end), f in flags.items() if start <= ptr < end]
        assert owner and "hg" in owner[0], f"the weight at {ptr:#x} is not in a MADV_HUGEPAGE mapping"
