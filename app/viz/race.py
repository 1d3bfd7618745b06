"""The speed race: tokens produced against decoding time, EAGLE and vanilla on one chart.

Time is the engine's own per-step wall time (``step_ms``: draft + verify + commit; the
prefill step, the same for both, is left out), the same clock for both methods, so the drawing and the page add nothing to either
curve and the ratio of the end points is the measured speedup.
"""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from app.engine.events import StepEvent, decoding_steps
from app.viz import style


def curve(steps: list[StepEvent]) -> tuple[list[float], list[int]]:
    """(seconds, tokens) after each step, starting at (0, 0)."""
    xs, ys, t, n = [0.0], [0], 0.0, 0
    for s in decoding_steps(steps):
        t += s.step_ms / 1000.0
        n += len(s.new_tokens)
        xs.append(t)
        ys.append(n)
    return xs, ys


@dataclass(frozen=True)
class RaceSpeedup:
    """The race's speedup and its spread, from one computation (so the headline can never lie
    outside its own range).

    Both runs are compared over the same answer tokens: the first ``tokens`` of each (the
    shorter run's length), cut into windows of ``chunk_tokens``. A window's time on each
    curve is read off the curve (``time_at``: linear between the steps), so the k-th window
    of each covers the same tokens. ``chunks`` are the per-window ratios vanilla time /
    EAGLE time; ``total`` is the ratio over all of them, a mean of the chunk ratios weighted
    by EAGLE's time, hence always within [min(chunks), max(chunks)]."""

    total: float
    chunks: tuple[float, ...]
    tokens: int
    chunk_tokens: int

    @property
    def low(self) -> float:
        return min(self.chunks) if self.chunks else self.total

    @property
    def high(self) -> float:
        return max(self.chunks) if self.chunks else self.total

    @property
    def drowned(self) -> bool:
        """Whether the neighbours drowned the race: its chunks fall on both sides of 1× and
        spread wider than the overall ratio's distance from 1×, so the wall clock cannot tell
        which method is faster (a busy machine slowed some chunks of one side and not the
        other). The count of forwards, which load cannot change, still can."""
        return (len(self.chunks) >= 2 and self.low < 1.0 < self.high
                and self.high - self.low > abs(self.total - 1.0))

    def text(self) -> str:
        """"1.31× (1.18–1.42 over 6 chunks of 16 tokens)"; only the total under two chunks."""
        if len(self.chunks) < 2:
            return f"{self.total:.2f}×"
        return (f"{self.total:.2f}× ({self.low:.2f}–{self.high:.2f} over {len(self.chunks)} chunks of "
                f"{self.chunk_tokens} tokens)")


def time_at(xs: list[float], ys: list[int], n: float) -> float:
    """Seconds a curve (``curve``) took to reach ``n`` tokens, linear within a step."""
    for i in range(1, len(ys)):
        if ys[i] >= n:
            y0, y1 = ys[i - 1], ys[i]
            return xs[i - 1] + (xs[i] - xs[i - 1]) * ((n - y0) / (y1 - y0) if y1 > y0 else 1.0)
    return xs[-1]


def race_speedup(eagle_steps: list[StepEvent], vanilla_steps: list[StepEvent],
                 chunk_tokens: int = 16) -> RaceSpeedup | None:
    """The race's speedup (``RaceSpeedup``), or None without two timed runs."""
    (xe, ye), (xv, yv) = curve(eagle_steps), curve(vanilla_steps)
    tokens = min(ye[-1], yv[-1])
    if tokens <= 0 or xe[-1] <= 0 or xv[-1] <= 0:
        return None
    edges = list(range(0, tokens, chunk_tokens)) + [tokens]
    chunks = []
    for a, b in zip(edges, edges[1:]):
        te = time_at(xe, ye, b) - time_at(xe, ye, a)
        tv = time_at(xv, yv, b) - time_at(xv, yv, a)
        if te > 0 and tv > 0:
            chunks.append(tv / te)
    te, tv = time_at(xe, ye, tokens), time_at(xv, yv, tokens)
    if te <= 0 or tv <= 0:
        return None
    return RaceSpeedup(total=tv / te, chunks=tuple(chunks), tokens=tokens, chunk_tokens=chunk_tokens)


def turns_ahead(a: RaceSpeedup, b: RaceSpeedup) -> tuple[int, int]:
    """(windows where ``a``'s ratio beat ``b``'s, windows compared). Two races over the same
    answer tokens cover the same tokens in their k-th window, each against its own vanilla
    time, so the comparison is window by window: a range's spread is mostly the text (some
    stretches draft better), and two overlapping ranges say nothing when one run was ahead
    in every window."""
    pairs = list(zip(a.chunks, b.chunks))
    return sum(x > y for x, y in pairs), len(pairs)


def speedup(eagle_steps: list[StepEvent], vanilla_steps: list[StepEvent]) -> float | None:
    """Tokens/s of EAGLE over tokens/s of vanilla over the same answer tokens (``race_speedup``)."""
    r = race_speedup(eagle_steps, vanilla_steps)
    return None if r is None else r.total


def race_figure(eagle_steps: list[StepEvent], vanilla_steps: list[StepEvent] | None,
                eagle_label: str = "EAGLE", height: int = 300) -> go.Figure:
    layout = dict(style.BASE_LAYOUT, height=height, uirevision="race",
                  title=dict(text="speed race: tokens vs decoding time", x=0.01),
                  xaxis=dict(title=dict(text="seconds (decoding, after prefill)"), rangemode="tozero"),
                  yaxis=dict(title=dict(text="tokens"), rangemode="tozero"),
                  legend=dict(x=0.01, y=0.99))
    data = []
    if eagle_steps:
        x, y = curve(eagle_steps)
        data.append(dict(type="scatter", x=x, y=y, mode="lines", name=eagle_label,
                         line=dict(color=style.EAGLE, width=3)))
    if vanilla_steps:
        x, y = curve(vanilla_steps)
        data.append(dict(type="scatter", x=x, y=y, mode="lines", name="vanilla",
                         line=dict(color=style.VANILLA, width=2, dash="dot")))
    return style.fast_figure(data, layout)


def chunk_speedups(eagle_steps: list[StepEvent], vanilla_steps: list[StepEvent], chunk_tokens: int = 16) -> list[float]:
    """EAGLE's speed over vanilla's per window of ``chunk_tokens`` answer tokens
    (``race_speedup``'s chunks). The page runs the two alternately in such chunks
    (``app.ui.race.interleave``), so the k-th chunk of each ran within moments of the other:
    their spread is the speedup's uncertainty on a machine whose load changes."""
    r = race_speedup(eagle_steps, vanilla_steps, chunk_tokens)
    return [] if r is None else list(r.chunks)


def speedup_with_spread(eagle_steps, vanilla_steps, chunk_tokens: int = 16) -> str:
    """"1.31× (1.18–1.42 over 6 chunks of 16 tokens)", or "" without both runs."""
    r = race_speedup(eagle_steps, vanilla_steps, chunk_tokens)
    return "" if r is None else r.text()
