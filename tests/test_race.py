"""The fair race (app/ui/race.py, app/viz/race.py): EAGLE and vanilla alternate in chunks of
tokens, and the speedup's spread comes from those chunks."""
from __future__ import annotations

import pytest

from app.engine.events import RunSummary, StepEvent
from app.ui.race import EAGLE, VANILLA, interleave
from app.viz.race import chunk_speedups, speedup, speedup_with_spread


def steps(tokens_per_step: int, n_steps: int, ms: float, prefill: bool = True) -> list[StepEvent]:
    out = [StepEvent(step=0, method="x", tree=None, accepted=[], bonus=1, new_tokens=[1], text="", prefill=True,
                     step_ms=999.0)] if prefill else []
    for i in range(n_steps):
        out.append(StepEvent(step=len(out), method="x", tree=None, accepted=[1] * (tokens_per_step - 1), bonus=1,
                             new_tokens=[1] * tokens_per_step, text="", step_ms=ms))
    return out


def stream(records, closed: list):
    try:
        yield from records
        yield RunSummary(method="x", new_tokens=0, seconds=0, tokens_per_s=0, target_forwards=0, mean_accepted=0,
                         accepted_by_depth=[], token_ids=[], text="")
    finally:
        closed.append(1)


def test_interleave_alternates_in_chunks_and_keeps_vanilla_level():
    closed = []
    e, v = steps(3, 20, 10.0), steps(1, 61, 5.0)
    out = list(interleave(stream(e, closed), stream(v, closed), chunk_tokens=8))
    sides = [s for s, _ in out]
    assert sides.count(EAGLE) == len(e) + 1 and sides.count(VANILLA) == len(v) + 1   # both to their ends
    switches = sum(a != b for a, b in zip(sides, sides[1:]))
    assert switches >= 10                                # alternated, not one run then the other
    n_e = n_v = 0                                        # vanilla never runs ahead of EAGLE by a chunk
    for side, ev in out:
        k = len(ev.new_tokens) if ev.type == "step" else 0
        if side == EAGLE:
            n_e += k
        else:
            n_v += k
            assert n_v <= n_e + 8 or n_e == 61
    assert closed == [1, 1]


def test_interleave_without_vanilla_and_closing_early():
    closed = []
    out = list(interleave(stream(steps(2, 5, 1.0), closed), None))
    assert {s for s, _ in out} == {EAGLE} and closed == [1]
    closed = []
    gen = interleave(stream(steps(2, 50, 1.0), closed), stream(steps(1, 100, 1.0), closed), chunk_tokens=4)
    assert [next(gen)[0] for _ in range(5)] == [EAGLE, EAGLE, EAGLE, VANILLA, VANILLA]
    gen.close()                                          # Stop: both engine runs are closed
    assert closed == [1, 1]
    with pytest.raises(ValueError, match="chunk_tokens"):
        next(interleave(iter([]), None, chunk_tokens=0))


def test_chunk_speedups_see_a_change_of_load_that_the_total_hides():
    """EAGLE 3 tokens / 30 ms, vanilla 1 token / 20 ms: 2x. If the machine gets twice as slow
    halfway, interleaved chunks still each say 2x (both slowed alike)."""
    e = steps(3, 8, 30.0) + [s for s in steps(3, 8, 60.0, prefill=False)]
    v = steps(1, 24, 20.0) + [s for s in steps(1, 24, 40.0, prefill=False)]
    for i, s in enumerate(e):
        object.__setattr__(s, "step", i)
    ratios = chunk_speedups(e, v, chunk_tokens=12)
    assert len(ratios) == 4 and all(r == pytest.approx(2.0) for r in ratios)
    assert speedup(e, v) == pytest.approx(2.0)
    assert speedup_with_spread(e, v, 12).startswith("2.00× (2.00–2.00 over 4 chunks of 12 tokens)")
    # the prefill (999 ms) is in neither: it is the same for both methods and not decoding
    assert speedup_with_spread(e[:1], v[:1]) == ""
