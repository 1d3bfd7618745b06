"""A/B: two runs side by side (two tree shapes, two heads, greedy vs sampled, ...).

- ``ab_figure``: acceptance by depth for A and B (the engine's ``acceptance_by_depth``), tau
  (new tokens per target forward, bonus included) and tokens/s, with vanilla decoding's
  tokens/s as a dashed line when it is known;
- ``ab_trees_figure``: the two runs' trees at the same step index, drawn as ``tree.py`` draws
  one, on one shared confidence scale.

Both take step records and summaries only.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.engine.events import RunSummary, StepEvent, acceptance_by_depth
from app.viz import style
from app.viz.race import turns_ahead
from app.viz.tree import COLORBAR_PX, MARGIN, tree_axes, tree_height, tree_traces

AB_COLOURS = ("#7c3aed", "#ea580c")   # run A, run B


def _pair(value) -> tuple:
    """(A's, B's) from a pair, or the same value for both."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def ab_figure(a_steps: list[StepEvent], a_summary: RunSummary, b_steps: list[StepEvent], b_summary: RunSummary,
              labels: tuple[str, str] = ("A", "B"), vanilla_tokens_per_s=None, races=(None, None),
              height: int = 300) -> go.Figure:
    """Three panels: acceptance rate by depth (grouped bars), tau, tokens/s. Each run is set
    against its *own* vanilla: ``vanilla_tokens_per_s`` is (A's, B's) (a dashed line each),
    ``races`` their ``RaceSpeedup`` (the ratio printed on the bar, the same number as that
    run's headline)."""
    vanillas, races = _pair(vanilla_tokens_per_s), _pair(races)
    fig = make_subplots(rows=1, cols=3, column_widths=[0.5, 0.25, 0.25], horizontal_spacing=0.08,
                        subplot_titles=("acceptance rate by depth", "τ: tokens per target forward",
                                        "tokens/s (decoding)"))
    runs = ((labels[0], a_steps, a_summary, AB_COLOURS[0], races[0]),
            (labels[1], b_steps, b_summary, AB_COLOURS[1], races[1]))
    for name, steps, summary, colour, race in runs:
        rates = acceptance_by_depth(steps)
        fig.add_trace(go.Bar(x=list(range(1, len(rates) + 1)), y=rates, name=name, marker_color=colour,
                             legendgroup=name, hovertemplate=f"{name}, depth %{{x}}: %{{y:.0%}} accepted<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Bar(x=[name], y=[summary.mean_accepted], marker_color=colour, showlegend=False,
                             legendgroup=name, text=[f"{summary.mean_accepted:.2f}"], textposition="outside",
                             hovertemplate=f"{name}: τ = %{{y:.2f}} tokens per forward<extra></extra>"), row=1, col=2)
        speedup = f" ×{race.total:.2f}" if race is not None else ""
        fig.add_trace(go.Bar(x=[name], y=[summary.tokens_per_s], marker_color=colour, showlegend=False,
                             legendgroup=name, text=[f"{summary.tokens_per_s:.0f}{speedup}"], textposition="outside",
                             hovertemplate=f"{name}: %{{y:.1f}} tokens/s{speedup} vs its own vanilla<extra></extra>"),
                      row=1, col=3)
    fig.add_hline(y=1.0, line=dict(color=style.VANILLA, dash="dot", width=1.5), row=1, col=2,
                  annotation_text="vanilla: 1", annotation_position="bottom right", annotation_font_size=10,
                  annotation_bgcolor="rgba(255,255,255,0.85)")
    # two vanillas within 5% of each other share one line (their labels would overlap)
    same = vanillas[0] and vanillas[1] and abs(vanillas[0] - vanillas[1]) <= 0.05 * max(vanillas)
    for letter, v in zip(("A", "B"), vanillas):
        if v and not (same and letter == "B"):
            fig.add_hline(y=v, line=dict(color=style.VANILLA, dash="dash", width=2), row=1, col=3,
                          annotation_text=(f"vanilla {v:.0f}" if vanillas[0] == vanillas[1] else
                                           f"vanillas ≈ {v:.0f}") if same else f"{letter}'s vanilla {v:.0f}",
                          annotation_position="bottom right" if letter == "A" else "top right",
                          annotation_font_size=10, annotation_bgcolor="rgba(255,255,255,0.85)")
    top_tau = max(a_summary.mean_accepted, b_summary.mean_accepted, 1.0)
    top_tps = max(a_summary.tokens_per_s, b_summary.tokens_per_s, *(v or 0.0 for v in vanillas))
    fig.update_layout(style.BASE_LAYOUT, height=height, barmode="group", uirevision="ab",
                      legend=dict(orientation="h", x=0.5, xanchor="center", y=-0.22, yanchor="top"),
                      margin=dict(l=44, r=20, t=40, b=70))
    fig.update_xaxes(showticklabels=False, row=1, col=2)   # the legend names the runs
    fig.update_xaxes(showticklabels=False, row=1, col=3)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=1, col=1)
    fig.update_xaxes(title=dict(text="depth", standoff=2), dtick=1, row=1, col=1)
    fig.update_yaxes(range=[0, top_tau * 1.25], row=1, col=2)
    fig.update_yaxes(range=[0, top_tps * 1.25], row=1, col=3)
    fig.update_annotations(font_size=12)
    return fig


def ab_trees_figure(a_step: StepEvent | None, b_step: StepEvent | None, labels: tuple[str, str] = ("A", "B"),
                    fold: bool | None = None) -> go.Figure:
    """The two runs' trees at one step index, side by side (one confidence colour bar)."""
    return trees_side_by_side(list(zip(labels, (a_step, b_step))), fold=fold, revision="ab-trees")


def trees_side_by_side(panels: list[tuple[str, StepEvent | None]], fold: bool | None = None,
                       revision: str = "trees") -> go.Figure:
    """One tree per panel, left to right, each drawn as ``tree.py`` draws one, on one shared
    confidence scale (the colour bar beside the last panel). A panel whose step is missing or
    has no tree says so instead."""
    n = max(1, len(panels))
    gap = 0.08 if n == 2 else 0.04
    width = (1.0 - gap * (n - 1)) / n
    data, annotations, heights, layouts = [], [], [], []
    for panel, (name, step) in enumerate(panels):
        suffix = "" if panel == 0 else str(panel + 1)
        x, y = f"x{suffix}", f"y{suffix}"
        if step is None or step.tree is None or not len(step.tree):
            layouts.append(None)
            what = "no step" if step is None else "prefill: no tree" if step.prefill else "no tree"
            annotations.append(dict(text=f"{name}: {what}", showarrow=False, xref=f"{x} domain", yref="paper",
                                    x=0.0, y=1.0, xanchor="left", yanchor="bottom", font=dict(size=13)))
            continue
        traces, lay = tree_traces(step, fold=fold, show_colorbar=panel == n - 1, axes=(x, y))
        data += traces
        layouts.append(lay)
        heights.append(tree_height(lay))
        annotations.append(dict(text=f"<b>{name}</b>: step {step.step}, {len(step.tree)} nodes, "
                                     f"{len(step.accepted)} accepted", showarrow=False, xref=f"{x} domain", yref="paper",
                                x=0.0, y=1.0, yshift=44, xanchor="left", yanchor="bottom", font=dict(size=13)))
    height = max(heights, default=220) + 20
    layout = dict(style.BASE_LAYOUT, height=height, showlegend=False, uirevision=revision, hovermode="closest",
                  margin=dict(MARGIN, t=MARGIN["t"] + 20, r=COLORBAR_PX + 10), annotations=annotations)
    for panel, lay in enumerate(layouts):
        suffix = "" if panel == 0 else str(panel + 1)
        left = panel * (width + gap)
        domain = [left, left + width]
        if lay is None:
            layout[f"xaxis{suffix}"] = dict(domain=domain, visible=False)
            layout[f"yaxis{suffix}"] = dict(visible=False, anchor=f"x{suffix}")
            continue
        xaxis, yaxis = tree_axes(lay, height - 20)
        # room on the right of the panel's deepest column for its labels (~8 px per column unit is safe)
        xaxis["range"][1] += 1.0
        layout[f"xaxis{suffix}"] = dict(xaxis, domain=domain)
        layout[f"yaxis{suffix}"] = dict(yaxis, anchor=f"x{suffix}")
    return style.fast_figure(data, layout)


TAU_SAME = 0.005   # τ printed to two decimals: closer than this reads as equal


def ab_caption(a_summary: RunSummary, b_summary: RunSummary, labels: tuple[str, str] = ("A", "B"),
               races=(None, None), sizes=(None, None)) -> str:
    """A few sentences: each run's τ, tokens/s and its speedup over its *own* vanilla (the
    same ``RaceSpeedup`` as that run's headline), then only what the numbers support: which
    accepted more per forward (or that τ is the same), which was faster (``_speed_verdict``),
    and, when the bigger tree (``sizes``: total_tokens) did accept
    more, that it also costs more per forward."""
    races = _pair(races)
    parts = []
    for name, s, race in zip(labels, (a_summary, b_summary), races):
        vs = f", **{race.text()}** its own vanilla" if race is not None else ", no vanilla raced"
        parts.append(f"{name}: τ = {s.mean_accepted:.2f} tokens per target forward, {s.tokens_per_s:.1f} tokens/s{vs}.")
    text = " ".join(parts)
    ta, tb = a_summary.mean_accepted, b_summary.mean_accepted
    if abs(ta - tb) < TAU_SAME:
        text += (f" Both accepted the same τ ({ta:.2f}): any difference in speed comes from what a step costs "
                 "(the tree's size, the machine's load), not from acceptance.")
    else:
        more, less = (0, 1) if ta > tb else (1, 0)
        text += f" {labels[more].split(':')[0]} accepted more per forward ({max(ta, tb):.2f} against {min(ta, tb):.2f})"
        sa, sb = sizes
        if sa is not None and sb is not None and sa != sb and (sa > sb) == (more == 0):
            text += ", with the bigger tree, whose forward also costs more"
        text += ": tokens/s, not τ, says which pays on this machine."
    ra, rb = races
    if ra is not None and rb is not None:
        text += _speed_verdict(a_summary, b_summary, ra, rb, [label.split(":")[0] for label in labels])
    return text


def _speed_verdict(a_summary: RunSummary, b_summary: RunSummary, ra, rb, names: list[str]) -> str:
    """Which run was faster, as far as the numbers tell. Runs that decoded the same text (the
    same prompt, greedy: any tree gives the same tokens) are compared stretch by stretch
    (``race.turns_ahead``), each against its own vanilla, so the load of the moment cancels.
    Runs over different text have only their ranges to go by."""
    stretch = f"stretches of {ra.chunk_tokens} tokens"
    ahead, turns = turns_ahead(ra, rb)
    if a_summary.token_ids == b_summary.token_ids and turns > 1:
        if ahead in (0, turns):
            return (f" {names[0 if ahead else 1]} was faster in every one of the {turns} {stretch} "
                    "(the same text, each against its own vanilla).")
        return (f" Over the same text each was faster in some of the {turns} {stretch} ({names[0]} in "
                f"{ahead}): no winner on speed.")
    if ra.low <= rb.high and rb.low <= ra.high:
        return (f" Their speedups ({ra.total:.2f}× and {rb.total:.2f}×) overlap (the ranges over their {stretch}), "
                "and they decoded different text: no winner on speed.")
    return f" {names[0 if ra.total > rb.total else 1]} was faster, beyond the ranges over their {stretch}."
