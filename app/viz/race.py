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
