"""The speed race: tokens produced against decoding time, EAGLE and vanilla on one chart.

Time is the engine's own per-step wall time (``step_ms``: draft + verify + commit; the
prefill step, the same for both, is left out), the same clock for both methods, so the drawing and the page add nothing to either
curve and the ratio of the end points is the measured speedup.
"""
from __future__ import annotations

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


def speedup(eagle_steps: list[StepEvent], vanilla_steps: list[StepEvent]) -> float | None:
    """Tokens/s of EAGLE over tokens/s of vanilla, from the two curves' end points."""
    (xe, ye), (xv, yv) = curve(eagle_steps), curve(vanilla_steps)
    if xe[-1] <= 0 or xv[-1] <= 0 or yv[-1] == 0:
        return None
    return (ye[-1] / xe[-1]) / (yv[-1] / xv[-1])


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
    """EAGLE's tokens/s over vanilla's, per window of ``chunk_tokens`` answer tokens.

    The page runs the two alternately in such chunks (``app.ui.race.interleave``), so the
    k-th chunk of each ran within moments of the other: the spread of these ratios is the
    speedup's uncertainty on a machine whose load changes. A step belongs to the window of
    the first token it produced; a window either side did not reach is left out."""
    def windows(steps):
        out: dict[int, list[float]] = {}
        n = 0
        for s in decoding_steps(steps):
            w = out.setdefault(n // chunk_tokens, [0.0, 0.0])
            w[0] += len(s.new_tokens)
            w[1] += s.step_ms
            n += len(s.new_tokens)
        return out
    e, v = windows(eagle_steps), windows(vanilla_steps)
    ratios = []
    for k in sorted(set(e) & set(v)):
        (ne, te), (nv, tv) = e[k], v[k]
        if te > 0 and tv > 0 and nv > 0:
            ratios.append((ne / te) / (nv / tv))
    return ratios


def speedup_with_spread(eagle_steps, vanilla_steps, chunk_tokens: int = 16) -> str:
    """"1.31× (1.18–1.42 over 6 chunks of 16 tokens)", or "" without both runs."""
    total = speedup(eagle_steps, vanilla_steps)
    if total is None:
        return ""
    ratios = chunk_speedups(eagle_steps, vanilla_steps, chunk_tokens)
    if len(ratios) < 2:
        return f"{total:.2f}×"
    return f"{total:.2f}× ({min(ratios):.2f}–{max(ratios):.2f} over {len(ratios)} chunks of {chunk_tokens} tokens)"
