"""The draft tree of one step as a plotly figure.

Layout: a classic tidy tree drawn top-down. The tree is built as a networkx ``DiGraph``
(root -> children, children in draft-rank order); leaves get consecutive x positions in
depth-first order and every parent is centred over its first and last child, so subtrees
never overlap and parents sit over their children. y is minus the depth.

Drawing: nodes are coloured by draft confidence on a fixed 0..1 scale (with a colour bar),
labelled with their token; the accepted path is drawn bold and green, rejected nodes get a
red ring with a cross, unreached nodes are faded, and the target's bonus token hangs below
the last accepted node as a blue diamond — the target's own node. Hover shows token, q, p,
confidence, depth and status.
"""
from __future__ import annotations

import html

import networkx as nx
import plotly.graph_objects as go

from app.engine.events import StepEvent
from app.viz import style
from app.viz.stream import split_step_text

ROOT_ID = "root"
BONUS_ID = "bonus"


def show_token(text: str, escape: bool = True) -> str:
    """A token as a short visible label: spaces and newlines made visible; HTML escaped for
    plotly labels, or (``escape=False``) made safe for a Markdown code span instead."""
    text = text.replace("\n", "↵").replace("\t", "⇥")
    if text.startswith(" "):
        text = "␣" + text[1:]
    if len(text) > 12:
        text = text[:11] + "…"
    if not text:
        return "∅"
    return html.escape(text) if escape else text.replace("`", "ˋ")


def tree_graph(parents: list[int], bonus_parent: int | None = None) -> nx.DiGraph:
    """networkx tree: node ids are draft indices, plus ``ROOT_ID`` and (optionally) ``BONUS_ID``
    attached under draft node ``bonus_parent`` (-1 = under the root)."""
    g = nx.DiGraph()
    g.add_node(ROOT_ID)
    for i, parent in enumerate(parents):
        g.add_edge(ROOT_ID if parent < 0 else parent, i)
    if bonus_parent is not None:
        g.add_edge(ROOT_ID if bonus_parent < 0 else bonus_parent, BONUS_ID)
    return g


def tidy_layout(g: nx.DiGraph, root=ROOT_ID) -> dict:
    """{node: (x, y)} for a tree: leaves 0, 1, 2, ... left to right in depth-first order,
    each parent centred over its children, y = -depth."""
    pos: dict = {}
    next_leaf = 0
    depth = nx.shortest_path_length(g, root)
    for node in nx.dfs_postorder_nodes(g, root):  # children are finished before their parent
        kids = list(g.successors(node))
        if kids:
            x = (pos[kids[0]][0] + pos[kids[-1]][0]) / 2
        else:
            x, next_leaf = float(next_leaf), next_leaf + 1
        pos[node] = (x, -depth[node])
    return pos


def _bonus_parent(step: StepEvent) -> int | None:
    """The draft node the bonus token follows (-1 = the root), or None when the step ended at
    EOS / the token budget before the bonus token."""
    if len(step.new_tokens) <= len(step.accepted):
        return None
    tree = step.tree
    accepted = [i for i, s in enumerate(tree.status) if s == "accepted"]
    return max(accepted, key=lambda i: tree.depths[i]) if accepted else -1


def _fmt(value) -> str:
    return "—" if value is None else f"{value:.3f}"


def tree_figure(step: StepEvent | None, title: str | None = None, bonus_text: str | None = None,
                height: int = 380) -> go.Figure:
    """The figure for one step's draft tree (an empty, captioned figure when there is none).

    ``bonus_text`` labels the bonus node; by default it is the step text after the accepted
    draft tokens (see ``stream.split_step_text``), so no tokenizer is needed.
    """
    layout = dict(style.BASE_LAYOUT, height=height, uirevision="tree", showlegend=False,
                  xaxis=dict(visible=False), yaxis=dict(visible=False))
    if step is None or step.tree is None or not len(step.tree):
        caption = ("no draft tree: vanilla decoding (one token per target forward)"
                   if step is not None and step.method == "vanilla" else "no step yet")
        layout.update(title=dict(text=title or "draft tree", x=0.01),
                      annotations=[dict(text=caption, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")])
        return style.fast_figure([], layout)

    tree = step.tree
    bonus_parent = _bonus_parent(step)
    pos = tidy_layout(tree_graph(tree.parents, bonus_parent))
    n = len(tree)

    # Edges: one grey trace for all, one bold green trace for the accepted path.
    grey_x, grey_y, green_x, green_y = [], [], [], []
    for i, parent in enumerate(tree.parents):
        (x0, y0), (x1, y1) = pos[ROOT_ID if parent < 0 else parent], pos[i]
        on_path = tree.status[i] == "accepted"
        xs, ys = (green_x, green_y) if on_path else (grey_x, grey_y)
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    if bonus_parent is not None:
        (x0, y0), (x1, y1) = pos[ROOT_ID if bonus_parent < 0 else bonus_parent], pos[BONUS_ID]
        green_x += [x0, x1, None]
        green_y += [y0, y1, None]
    data = [dict(type="scatter", x=grey_x, y=grey_y, mode="lines", hoverinfo="skip",
                 line=dict(color=style.EDGE, width=1)),
            dict(type="scatter", x=green_x, y=green_y, mode="lines", hoverinfo="skip",
                 line=dict(color=style.DRAFT, width=4))]

    # Draft nodes.
    p = tree.p if tree.p is not None else [None] * n
    symbols = {"accepted": "circle", "rejected": "circle-x", "unreached": "circle"}
    line_colour = {"accepted": style.DRAFT, "rejected": style.REJECTED, "unreached": "#d1d5db"}
    hover = [
        f"<b>{show_token(tree.texts[i])}</b> (id {tree.tokens[i]})<br>status: {tree.status[i]}"
        f"<br>depth: {tree.depths[i]}<br>q (draft): {_fmt(tree.q[i])}<br>p (target): {_fmt(p[i])}"
        f"<br>confidence: {_fmt(tree.confidence[i])}"
        for i in range(n)]
    data.append(dict(
        type="scatter", x=[pos[i][0] for i in range(n)], y=[pos[i][1] for i in range(n)],
        mode="markers+text", text=[show_token(t) for t in tree.texts], textposition="bottom center",
        textfont=dict(size=10), hovertext=hover, hoverinfo="text",
        marker=dict(size=[16 if s == "accepted" else 12 for s in tree.status],
                    color=list(tree.confidence), cmin=0.0, cmax=1.0, colorscale=style.CONFIDENCE_SCALE,
                    colorbar=dict(title=dict(text="confidence", side="right"), thickness=10, len=0.8),
                    symbol=[symbols[s] for s in tree.status],
                    opacity=[style.UNREACHED_OPACITY if s == "unreached" else 1.0 for s in tree.status],
                    line=dict(color=[line_colour[s] for s in tree.status],
                              width=[3 if s != "unreached" else 1 for s in tree.status]))))

    # The root (last committed token) and the bonus token (the target's own node).
    data.append(dict(type="scatter", x=[pos[ROOT_ID][0]], y=[pos[ROOT_ID][1]], mode="markers+text",
                     text=["root"], textposition="top center", hoverinfo="text",
                     hovertext=[f"root: the last committed token (id {tree.root_token})"],
                     marker=dict(size=14, symbol="square", color=style.ROOT)))
    if bonus_parent is not None:
        if bonus_text is None:
            bonus_text = split_step_text(step)[1]
        label = show_token(bonus_text)
        data.append(dict(type="scatter", x=[pos[BONUS_ID][0]], y=[pos[BONUS_ID][1]], mode="markers+text",
                         text=[label], textposition="bottom center", hoverinfo="text",
                         hovertext=[f"<b>{label}</b> (id {step.bonus})<br>bonus token: the target's own "
                                    "choice after the accepted path"],
                         marker=dict(size=16, symbol="diamond", color=style.BONUS)))
    accepted = len(step.accepted)
    layout["title"] = dict(text=title or (
        f"step {step.step}: {n} draft nodes, {accepted} accepted"
        f"{' + bonus' if bonus_parent is not None else ''}"), x=0.01)
    return style.fast_figure(data, layout)
