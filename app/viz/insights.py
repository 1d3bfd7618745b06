"""Figures about a whole run: where the tree pays off, and why EAGLE-2's trees work.

- acceptance by depth: of the steps whose verification reached depth d, how often a token at
  depth d was accepted (the engine's own ``acceptance_by_depth``);
- calibration: every drafted node binned by its confidence (product of q along its path),
  against the share of that bin the target accepted. EAGLE-2 (arXiv 2406.16858) builds its
  dynamic trees on the observation that these lie near the diagonal: confidence is a good
  estimate of acceptance, so expanding the most confident nodes is a good bet;
- tokens per step: accepted draft tokens plus the bonus token, step by step;
- the threshold explorer's sweep: mean accepted tokens and tokens/s against one knob.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from app.engine.events import StepEvent, acceptance_by_depth
from app.viz import style


def _figure(title: str, height: int, **layout) -> go.Figure:
    layout.setdefault("showlegend", False)
    return go.Figure(layout=dict(style.BASE_LAYOUT, height=height, title=dict(text=title, x=0.01),
                                 uirevision=title, **layout))


def depth_figure(steps: list[StepEvent], height: int = 260) -> go.Figure:
    rates = acceptance_by_depth(steps)
    fig = _figure("acceptance rate by depth", height, xaxis=dict(title="depth", dtick=1),
                  yaxis=dict(title="accepted", range=[0, 1]))
    fig.add_trace(go.Bar(x=list(range(1, len(rates) + 1)), y=rates, marker_color=style.DRAFT,
                         hovertemplate="depth %{x}: %{y:.0%} accepted<extra></extra>"))
    return fig


def calibration_bins(steps: list[StepEvent], bins: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bin centres, observed acceptance rate per bin (NaN when empty), nodes per bin)."""
    conf, accepted = [], []
    for s in steps:
        if s.tree is not None:     # the head's own nodes only: a prompt-lookup node has no model's q
            own = [i for i in range(len(s.tree)) if s.tree.source is None or s.tree.source[i] is None]
            conf.extend(s.tree.confidence[i] for i in own)
            accepted.extend(s.tree.status[i] == "accepted" for i in own)
    edges = np.linspace(0.0, 1.0, bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    if not conf:
        return centres, np.full(bins, np.nan), np.zeros(bins, dtype=int)
    which = np.clip(np.digitize(np.asarray(conf), edges[1:-1]), 0, bins - 1)
    counts = np.bincount(which, minlength=bins)
    hits = np.bincount(which, weights=np.asarray(accepted, dtype=float), minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(counts > 0, hits / np.maximum(counts, 1), np.nan)
    return centres, rate, counts


def calibration_figure(steps: list[StepEvent], height: int = 260) -> go.Figure:
    centres, rate, counts = calibration_bins(steps)
    fig = _figure("calibration: confidence vs acceptance", height,
                  xaxis=dict(title="draft confidence (binned)", range=[0, 1]),
                  yaxis=dict(title="accepted", range=[0, 1]))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", hoverinfo="skip",
                             line=dict(color=style.EDGE, dash="dot")))
    keep = counts > 0
    fig.add_trace(go.Scatter(x=centres[keep], y=rate[keep], mode="lines+markers", customdata=counts[keep],
                             marker=dict(size=6 + 2 * np.sqrt(counts[keep]).clip(0, 8), color=style.DRAFT),
                             hovertemplate="confidence ≈ %{x:.2f}: %{y:.0%} accepted of %{customdata} nodes<extra></extra>"))
    return fig


def tokens_per_step_figure(steps: list[StepEvent], height: int = 260) -> go.Figure:
    fig = _figure("tokens per step (target forward)", height, barmode="stack",
                  xaxis=dict(title="step"), yaxis=dict(title="tokens"))
    x = [s.step for s in steps]
    drafted = [len(s.accepted) for s in steps]
    bonus = [len(s.new_tokens) - len(s.accepted) for s in steps]
    fig.add_trace(go.Bar(x=x, y=drafted, name="accepted draft", marker_color=style.DRAFT,
                         hovertemplate="step %{x}: %{y} accepted draft<extra></extra>"))
    fig.add_trace(go.Bar(x=x, y=bonus, name="bonus", marker_color=style.BONUS,
                         hovertemplate="step %{x}: %{y} bonus<extra></extra>"))
    return fig


BEST = "highest"   # explorer_figure's default: star the highest tokens/s


def explorer_figure(knob: str, results: list[dict], height: int = 320, best: dict | str | None = BEST) -> go.Figure:
    """``results``: one dict per value tried, {"value", "mean_accepted", "tokens_per_s"} and,
    when each value ran several times, "runs" (each run's tokens/s: drawn as a bar from the
    slowest to the fastest run). ``best``: the result to star (the default stars the highest
    tokens/s); None stars nothing (the values tie within the measured noise)."""
    fig = _figure(f"threshold explorer: {knob}", height, showlegend=True,
                  xaxis=dict(title=knob), yaxis=dict(title="tokens/s", rangemode="tozero"),
                  yaxis2=dict(title="mean accepted tokens / step", overlaying="y", side="right",
                              rangemode="tozero"),
                  legend=dict(orientation="h", x=0.99, xanchor="right", y=1.12),
                  margin=dict(l=50, r=60, t=36, b=40))
    if not results:
        return fig
    xs = [r["value"] for r in results]
    spread = None
    if all(len(r.get("runs", ())) > 1 for r in results):
        spread = dict(type="data", symmetric=False, color=style.DRAFT, thickness=1.5, width=6,
                      array=[max(r["runs"]) - r["tokens_per_s"] for r in results],
                      arrayminus=[r["tokens_per_s"] - min(r["runs"]) for r in results])
    fig.add_trace(go.Scatter(x=xs, y=[r["tokens_per_s"] for r in results], mode="lines+markers", error_y=spread,
                             name="tokens/s (bar: slowest to fastest run)" if spread else "tokens/s",
                             line=dict(color=style.DRAFT, width=3)))
    fig.add_trace(go.Scatter(x=xs, y=[r["mean_accepted"] for r in results], mode="lines+markers",
                             name="mean accepted (τ)", yaxis="y2", line=dict(color=style.BONUS, dash="dot")))
    if best == BEST:
        best = max(results, key=lambda r: r["tokens_per_s"])
    if best is None:
        return fig
    fig.add_trace(go.Scatter(x=[best["value"]], y=[best["tokens_per_s"]], mode="markers", name="best",
                             marker=dict(symbol="star", size=18, color="#f59e0b", line=dict(color="black", width=1))))
    return fig
