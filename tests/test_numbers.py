"""One source of truth for the numbers on the page: the headline speedup and its range, the
A/B comparison, the tree-size choice, the step account and the methods table each read the
same computation, so they cannot contradict each other."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.events import DraftTreeRecord, RunSummary, StepEvent
from app.viz import compare, methods
from app.viz.autotune import choice_markdown, chosen_candidate
from app.viz.phases import phase_account
from app.viz.race import race_speedup, speedup, speedup_with_spread


def timed(tokens_ms: list[tuple[int, float]], prefill: bool = True) -> list[StepEvent]:
    """Steps that each write ``tokens`` in ``ms`` (a prefill of 999 ms first)."""
    out = [StepEvent(step=0, method="x", tree=None, accepted=[], bonus=1, new_tokens=[1], text="", prefill=True,
                     step_ms=999.0)] if prefill else []
    for n, ms in tokens_ms:
        out.append(StepEvent(step=len(out), method="x", tree=None, accepted=[1] * (n - 1), bonus=1,
                             new_tokens=[1] * n, text="", step_ms=ms))
    return out


def summary(tau: float, tps: float, method: str = "dynamic") -> RunSummary:
    return RunSummary(method=method, new_tokens=40, seconds=1.0, tokens_per_s=tps, target_forwards=10,
                      mean_accepted=tau, accepted_by_depth=[], token_ids=[1, 2], text="")


def test_the_headline_can_not_lie_outside_its_range():
    """Seen on the page: a headline of 3.31x beside its own range 3.84-4.09. Steps that write
    several tokens straddle the windows, and a last window only one run reached: the old
    ratio-of-end-points and per-window ratios then disagreed. Now both come from the same
    windows of the same tokens."""
    eagle = timed([(4, 10.0)] * 8 + [(4, 80.0)] * 4)             # 48 tokens, a slow end
    vanilla = timed([(1, 10.0)] * 32)                             # 32 tokens (it ended first)
    r = race_speedup(eagle, vanilla, 16)
    assert r.low - 1e-9 <= r.total <= r.high + 1e-9
    assert speedup(eagle, vanilla) == r.total
    text = speedup_with_spread(eagle, vanilla, 16)
    head, low, high = map(float, re.match(r"([\d.]+)× \(([\d.]+)–([\d.]+) over", text).groups())
    assert low <= head <= high
    assert r.tokens == 32 and r.total == pytest.approx(4.0)      # the same tokens on both sides (was 1.20x)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.floats(1.0, 200.0)), min_size=1, max_size=40),
       st.lists(st.floats(1.0, 200.0), min_size=1, max_size=120), st.integers(1, 24))
def test_headline_within_range_for_any_two_runs(eagle, vanilla_ms, chunk):
    r = race_speedup(timed(eagle), timed([(1, ms) for ms in vanilla_ms]), chunk)
    assert r is not None
    assert r.low * (1 - 1e-9) <= r.total <= r.high * (1 + 1e-9)
    assert r.text().startswith(f"{r.total:.2f}×")


class _Race:
    def __init__(self, total, low, high):
        self.total, self.low, self.high, self.chunks, self.chunk_tokens = total, low, high, (low, high), 16

    def text(self):
        return f"{self.total:.2f}× ({self.low:.2f}–{self.high:.2f} over 2 chunks of 16 tokens)"


def test_ab_sets_each_run_against_its_own_vanilla_and_claims_only_what_the_numbers_say():
    """A's 1.23x stays 1.23x beside B (it was rescaled by B's vanilla); equal tau gets no
    "a bigger tree accepts more"; overlapping ranges get no winner."""
    a, b = summary(2.33, 30.0), summary(2.33, 20.0)
    ra, rb = _Race(1.23, 1.1, 1.3), _Race(0.69, 0.6, 0.8)
    text = compare.ab_caption(a, b, ("A: dynamic 16/4/4", "B: dynamic 60/6/10"), races=(ra, rb), sizes=(16, 60))
    assert "1.23×" in text and "0.69×" in text and "own vanilla" in text
    assert "×1.14" not in text and "accepts more" not in text and "accepted more" not in text
    assert "same τ" in text
    assert "A was faster in every one of the 2 stretches" in text
    # the same text, overlapping ranges, A ahead in every stretch: A was faster, not "no winner"
    overlapping = (_Race(1.2, 1.0, 1.4), _Race(1.1, 0.9, 1.3))
    text = compare.ab_caption(summary(2.0, 30.0), summary(3.1, 20.0), ("A: x", "B: y"), races=overlapping,
                              sizes=(16, 60))
    assert "B accepted more" in text and "bigger tree" in text
    assert "A was faster in every one" in text and "no winner" not in text
    # each ahead in some stretches: no winner
    text = compare.ab_caption(summary(2.0, 30.0), summary(2.0, 30.0), races=(_Race(1.2, 1.0, 1.4),
                                                                              _Race(1.2, 1.1, 1.3)))
    assert "each was faster in some of the 2 stretches of 16 tokens (A in 1): no winner" in text
    # different text: only the ranges, and overlapping ones name no winner
    other = replace(summary(3.1, 20.0), token_ids=[1, 3])
    text = compare.ab_caption(summary(2.0, 30.0), other, ("A: x", "B: y"), races=overlapping)
    assert "different text: no winner" in text
    fig = compare.ab_figure([], a, [], b, vanilla_tokens_per_s=(24.0, 29.0), races=(ra, rb))
    labels = [t.text[0] for t in fig.data if t.xaxis == "x3"]
    assert labels == ["30 ×1.23", "20 ×0.69"]
    assert sorted(s.y0 for s in fig.layout.shapes if s.yref == "y3") == [24.0, 29.0]


def test_tree_size_text_names_the_row_marked_chosen():
    """The text said "Chosen: total_tokens 3 ... 24.2 tokens/s" while the table marked 5/2/8
    at 26.6: the chosen tree is the smallest within noise of the fastest, not row 1."""
    from app.engine.autotune import choose_from
    from tests.test_autotune import CPU, big_tree_calibration

    choice = choose_from(CPU, big_tree_calibration()).to_dict()
    fastest = dict(choice["candidates"][0], total_tokens=99, depth=9, tokens_per_s=99.0)   # a faster, bigger one
    choice["candidates"] = [fastest] + choice["candidates"]
    best = chosen_candidate(choice)
    assert best is not fastest
    text = choice_markdown(choice)
    chosen_rows = [line for line in text.splitlines() if "← chosen" in line]
    assert len(chosen_rows) == 1
    cells = [c.strip() for c in chosen_rows[0].strip("|").split("|")]
    assert cells[0].split()[1].startswith(f"{best['total_tokens']}/{best['depth']}")
    assert f"predicted {best['tokens_per_s']:.1f} tokens/s" in text
    assert f"total_tokens {best['total_tokens']}, depth {best['depth']}" in text
    assert cells[4] == f"{best['tokens_per_s']:.1f}"


def test_step_account_counts_the_tokens_it_lists():
    """A step whose path the target agreed with past the answer's end (EOS, the budget):
    "2 draft tokens" listed three."""
    tree = DraftTreeRecord(tokens=[7, 8, 9, 10], parents=[-1, 0, 1, 0], depths=[1, 2, 3, 1],
                           q=[0.9, 0.8, 0.7, 0.1], p=[0.9, 0.8, 0.7, 0.05], confidence=[0.9, 0.72, 0.5, 0.1],
                           texts=[" a", " b", " c", " d"], status=["accepted", "accepted", "accepted", "rejected"],
                           root_token=5)
    step = StepEvent(step=3, method="dynamic", tree=tree, accepted=[7, 8], bonus=None, new_tokens=[7, 8],
                     text=" a b")
    account = phase_account(step, 5, 3)
    said = int(re.search(r"\*\*(\d+) draft tokens?\*\*", account).group(1))
    listed = re.search(r"draft tokens?\*\* \(([^;)]*)", account).group(1).count("`") // 2
    assert said == listed == 2
    assert "1 more matched after the answer's end" in account


def test_methods_table_marks_differences_within_the_noise():
    """Medusa 2.02x with tau 1.24 and prompt lookup 1.33x with tau 1.03, with no word about
    noise: each ratio now carries its chunk range, and overlaps are named."""
    vanilla = timed([(1, 10.0)] * 48)
    noisy = timed([(1, 4.0)] * 16 + [(1, 12.0)] * 16 + [(1, 6.0)] * 16)      # 2.5x, 0.83x, 1.67x by chunk
    steady = timed([(1, 7.0)] * 48)                                          # 1.43x throughout
    steps = {"vanilla": vanilla, "pld": steady, "medusa": noisy}
    summaries = {m: summary(1.0, 100.0 / (sum(s.step_ms for s in v[1:]) / 48), m) for m, v in steps.items()}
    table = methods.methods_table(summaries, {}, steps)
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "≈ vanilla" in rows["Medusa"] and "≈ vanilla" not in rows["prompt lookup"]
    assert "within noise of vanilla" in table.lower() and "prompt lookup and Medusa" in table
    assert f"{race_speedup(noisy, vanilla).total:.2f}×" in rows["Medusa"]
    assert f"{race_speedup(noisy, vanilla).total:.2f}×" in methods.literature_table(summaries, steps)


def test_a_method_ahead_in_every_turn_is_not_called_within_noise_of_another():
    """EAGLE-2 1.45x (1.21-1.98) and prompt lookup 1.06x (0.97-1.30) were called "within noise
    of each other" because their ranges overlapped; EAGLE-2 was ahead in every turn."""
    vanilla = timed([(1, 10.0)] * 32)
    ahead = timed([(1, 8.0)] * 16 + [(1, 5.0)] * 16)          # 1.25x, then 2.0x
    behind = timed([(1, 10.0)] * 16 + [(1, 7.7)] * 16)        # 1.0x, then 1.3x: ranges overlap
    traded = timed([(1, 7.0)] * 16 + [(1, 9.0)] * 16)         # 1.43x, then 1.11x: ahead of `behind` once
    steps = {"vanilla": vanilla, "dynamic": ahead, "pld": behind, "medusa": traded}
    summaries = {m: summary(1.0, 100.0 / (sum(s.step_ms for s in v[1:]) / 32), m) for m, v in steps.items()}
    table = methods.methods_table(summaries, {}, steps)
    assert race_speedup(ahead, vanilla).low <= race_speedup(behind, vanilla).high      # the ranges do overlap
    assert "EAGLE-2 (dynamic tree) and prompt lookup" not in table
    assert "prompt lookup and Medusa (prompt lookup ahead in 1 of 2 turns)" in table


def _raced_session(eagle_ms: list[float], vanilla_ms: list[float], tau: int = 3):
    """A finished greedy run of ``tau`` tokens a step beside its vanilla race, with these step times."""
    from app.ui.session import Session, VanillaRun

    eagle, vanilla = timed([(tau, ms) for ms in eagle_ms]), timed([(1, ms) for ms in vanilla_ms])
    n = tau * len(eagle_ms)
    mine = RunSummary(method="dynamic", new_tokens=n + 1, seconds=1.0, tokens_per_s=10.0,   # + the prefill's token
                      target_forwards=len(eagle_ms), mean_accepted=float(tau), accepted_by_depth=[],
                      token_ids=[1] * (n + 1), text="")
    theirs = RunSummary(method="vanilla", new_tokens=len(vanilla_ms), seconds=1.0, tokens_per_s=10.0,
                        target_forwards=len(vanilla_ms), mean_accepted=1.0, accepted_by_depth=[],
                        token_ids=[1] * len(vanilla_ms), text="")
    return Session(settings={"temperature": 0.0}, steps=eagle, summary=mine,
                   race_vanilla=VanillaRun(key=(), steps=vanilla, summary=theirs))


def test_a_race_drowned_by_load_says_so_and_counts_forwards_instead():
    """Seen on a busy machine: "Speedup 0.68× (0.27–2.06 over 4 chunks)", which a visitor reads
    as "EAGLE loses". When the chunks fall on both sides of 1× and spread wider than the ratio
    is from 1×, the page says the clock is drowned and gives τ and the forwards saved."""
    from app.ui.handlers.speedup import speedup_headline, speedup_text

    # 48 tokens, 3 a step: EAGLE's steps hit by a neighbour in the first half, vanilla's in the second
    session = _raced_session([40.0] * 8 + [6.0] * 8, [4.0] * 24 + [30.0] * 24)
    race = race_speedup(session.steps, session.race_vanilla.steps, 16)
    assert race.low < 1.0 < race.high and race.drowned
    head, text = speedup_headline(session), speedup_text(session)
    assert "drowned by the machine's load" in head and "67% fewer" in head and race.text() not in head
    assert text.startswith("### Speedup drowned by the machine's load")
    assert "first token, 48 tokens in 16 target forwards" in text and "vanilla needs 48" in text
    assert "67% fewer target forwards" in text


def test_a_clear_race_keeps_its_ratio():
    from app.ui.handlers.speedup import speedup_headline, speedup_text

    session = _raced_session([12.0] * 16, [10.0] * 48)                 # 2.5x, every chunk alike
    race = race_speedup(session.steps, session.race_vanilla.steps, 16)
    assert not race.drowned and race.total == pytest.approx(2.5)
    assert race.text() in speedup_headline(session) and "drowned" not in speedup_headline(session)
    assert speedup_text(session).startswith(f"### Speedup {race.text()}")
    # a noisy race that is still clearly on one side of 1x is not drowned
    noisy = _raced_session([12.0, 30.0] * 8, [10.0] * 48)
    assert not race_speedup(noisy.steps, noisy.race_vanilla.steps, 16).drowned
