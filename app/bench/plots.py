"""Benchmark figures with plotly, written as one HTML file. By default (``plotly_js="cdn"``)
the file is small (tens of kB) and loads plotly.js from its CDN when opened; ``"inline"``
embeds plotly.js (~4.8 MB), so that the file also opens offline. Writing needs no network
either way."""
from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from app.bench.report import ALL
from app.viz.autotune import choice_figure


def speedup_figure(summary: dict):
    """Grouped bars: speedup of every method over hf (or over vanilla without hf), per suite."""
    suites = [s for s in summary if s != ALL] + ([ALL] if ALL in summary else [])
    any_table = next(iter(summary.values()))
    ref = "hf" if "hf" in any_table else "vanilla"
    fig = go.Figure()
    for label in any_table:
        ys = [summary[s].get(label, {}).get(f"speedup_{ref}") for s in suites]
        fig.add_bar(name=label, x=suites, y=ys, text=[f"{y:.2f}×" if y else "" for y in ys], textposition="outside")
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(title=f"Speedup over {ref} (tokens/s ratio, same prompts, same run)", barmode="group",
                      yaxis_title=f"× {ref}", xaxis_title="suite", template="plotly_white")
    return fig


def acceptance_figure(summary: dict):
    """Acceptance rate by depth for every tree method, pooled over all suites of the run."""
    table = summary[ALL] if ALL in summary else next(iter(summary.values()))
    fig = go.Figure()
    for label, s in table.items():
        acc = s["acceptance_by_depth"]
        if acc:
            fig.add_scatter(name=f"{label} (tau {s['tau']:.2f})", x=list(range(1, len(acc) + 1)), y=acc,
                            mode="lines+markers")
    fig.update_layout(title="Acceptance by depth (given the path reached the depth above)",
                      xaxis_title="depth", yaxis_title="acceptance rate", yaxis_range=[0, 1.05],
                      template="plotly_white")
    return fig


def tree_mix_figure(summary: dict):
    """Stacked bars: the share of an adaptive method's steps on each tree, per suite (the tree
    each step ran, ``report.tree_mix``); None when no method adapts its tree."""
    suites = [s for s in summary if s != ALL] + ([ALL] if ALL in summary else [])
    labels = [label for label, s in next(iter(summary.values())).items() if s.get("adaptive")]
    if not labels:
        return None
    bars = [(suite, label) for label in labels for suite in suites]
    xs = [suite if len(labels) == 1 else f"{suite} · {label}" for suite, label in bars]
    mix_of = {(suite, label): summary[suite].get(label, {}).get("tree_mix", {}) for suite, label in bars}
    trees = list(dict.fromkeys(key for mix in mix_of.values() for key in mix))     # most-run first
    fig = go.Figure()
    for key in trees:
        mixes = [mix_of[bar].get(key) for bar in bars]
        fig.add_bar(name=key, x=xs, y=[100 * m["share"] if m else 0 for m in mixes],
                    customdata=[m["tau"] if m else None for m in mixes],
                    hovertemplate=f"{key}: %{{y:.0f}}% of the steps, tau %{{customdata:.2f}}<extra></extra>")
    fig.update_layout(title=f"{' / '.join(labels)}: steps by tree (share of the steps, per suite)", barmode="stack",
                      yaxis_title="% of steps", xaxis_title="suite", template="plotly_white")
    return fig


def write_plots(summary: dict, path: Path, plotly_js: str = "cdn", tree_choice: dict | None = None) -> Path:
    """The speedup and acceptance figures, the adaptive methods' steps by tree, and with ``tree_choice`` (the auto tree's
    ``TreeChoice.to_dict()``) the measured cost curve and every candidate's prediction.
    ``plotly_js``: ``"cdn"`` (a ``<script src>`` tag, small file) or ``"inline"`` (offline,
    ~4.8 MB); passed to plotly's ``include_plotlyjs``."""
    figs = [speedup_figure(summary), acceptance_figure(summary)]
    mix = tree_mix_figure(summary)
    if mix is not None:
        figs.append(mix)
    if tree_choice is not None:
        figs.append(choice_figure(tree_choice).update_layout(title="auto tree: why this size"))
    parts = [fig.to_html(full_html=False, include_plotlyjs=(plotly_js if i == 0 else False))
             for i, fig in enumerate(figs)]
    html = ("<!doctype html><html><head><meta charset='utf-8'><title>EAGLE Lens benchmark</title></head>"
            "<body>" + "\n".join(parts) + "</body></html>")
    path = Path(path)
    path.write_text(html, encoding="utf-8")
    return path
