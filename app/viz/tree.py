"""The draft tree of one step as a plotly figure.

Layout: an *outline*, like a file browser: one row per drawn node, in the column of its
depth, each label right of its node on its own row (``tree_layout.py`` places the nodes and
says why labels and edges cannot collide).

Drawing: EVERY draft node is filled with its own q, the head's probability of that token at
its branch, on a fixed log scale from 0.001 to 1 (``q_colour``; the path product, EAGLE-2's
ranking confidence, is in the hover). On a 0..1 scale of the path product almost every node
below depth 2 was the same dark colour; the head's own q per branch spreads over the whole
scale. What happened to a node is told by its outline, its shape and the edge into it, never
by its fill, so it reads without colour:

    accepted    circle, thick green outline, thick green edge (drawn last, on top)
    rejected    square, red outline, dotted red edge: the target checked it and chose another
    unreached   small circle, thin grey outline, dotted grey edge: an ancestor was rejected

The target's bonus token hangs from the last accepted node as a blue diamond (the target's own
node). Labels are truncated to ``LABEL_CHARS`` characters; hover shows the full token, q, p,
the path's confidence, depth, position and status.

Big trees: above ``FOLD_ABOVE`` nodes (EAGLE-2's 60-node trees, say) the tree is folded
around the accepted path (``tree_layout.fold_tree``): the path, the best ``max_siblings``
alternatives at each of its levels, and one grey "+N more" node per path node that counts
everything else hanging there.
``fold=False`` draws every node (the figure grows ``ROW_PX`` per node: the page scrolls).
"""
from __future__ import annotations

import html
import math
import unicodedata

import plotly.graph_objects as go

from app.engine.drafters.registry import DRAFTER_LABELS
from app.engine.events import StepEvent
from app.viz import style
from app.viz.stream import split_step_text
from app.viz.tree_layout import BONUS_ID, MAX_SIBLINGS, TreeLayout, accepted_path, tree_layout

LABEL_CHARS = 16        # longer tokens are cut (the full token is in the hover)
FONT_PX = 11            # label font size; labels use a monospace font (widths are predictable)
ROW_PX = 20             # vertical pixels per outline row: > a label's line height (~1.3 x FONT_PX)
FOLD_ABOVE = 30         # trees with more nodes than this are folded around the accepted path
MARGIN = dict(l=16, t=86, b=12)   # title, its second line, the depth labels (rotated on a phone)
COLORBAR_PX = 80        # room for the colour bar right of the labels
MIN_HEIGHT = 220
MIN_COLUMNS = 6         # a shallow tree still gets columns this wide (it does not stretch across the page)


# What proposed a step's nodes (``StepEvent.drafter``), as the tree's title names it: the
# drafters' registry holds the label of every name a record's ``drafter`` may hold.
DRAFTER_NAMES = DRAFTER_LABELS


# Special tokens as a reader names them (the chat template's markers)
SPECIAL_TOKENS = {"<|im_end|>": "⟨end of answer⟩", "<|endoftext|>": "⟨end of text⟩",
                  "<|im_start|>": "⟨start of turn⟩", "</s>": "⟨end of answer⟩", "<|eot_id|>": "⟨end of answer⟩",
                  "<|end_of_text|>": "⟨end of text⟩"}
Q_MIN = 1e-3            # the colour scale's floor: q below this is drawn as this


def q_colour(q: float | None) -> float:
    """The value a node's fill encodes: log10 of its own q, clipped to [log10(Q_MIN), 0]."""
    return math.log10(min(max(q or 0.0, Q_MIN), 1.0))


def show_token(text: str, escape: bool = True, limit: int = 12) -> str:
    """A token as a short visible label: spaces and newlines made visible (␣ ↵ ⇥), special
    tokens named (``SPECIAL_TOKENS``), cut to ``limit`` characters; HTML escaped for plotly
    labels, or (``escape=False``) made safe for a Markdown code span instead."""
    for raw, name in SPECIAL_TOKENS.items():
        text = text.replace(raw, name)
    text = text.replace("\n", "↵").replace("\t", "⇥")
    if text.startswith(" "):
        text = "␣" + text[1:]
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if not text:
        return "∅"
    # plotly's text renders &lt; &gt; &amp; but not &quot;: quotes stay as they are
    return html.escape(text, quote=False) if escape else text.replace("`", "ˋ")


def label_width_px(label: str, font_px: float = FONT_PX) -> float:
    """Width of a (possibly HTML-escaped, possibly <b>-wrapped) label in a monospace font:
    0.6 em per character, 1 em for East Asian wide characters."""
    text = html.unescape(label.replace("<b>", "").replace("</b>", ""))
    return sum(font_px * (1.0 if unicodedata.east_asian_width(c) in "WF" else 0.6) for c in text)


# --- the figure -------------------------------------------------------------------------------

def _bonus_parent(step: StepEvent) -> int | None:
    """The draft node the bonus token follows (-1 = the root), or None when the step ended at
    EOS / the token budget before the bonus token."""
    if len(step.new_tokens) <= len(step.accepted):
        return None
    path = accepted_path(step)
    return path[-1] if path else -1


def _quoted(text: str) -> str:
    """A token in full for a hover: quoted, escapes visible, HTML-safe."""
    return html.escape(repr(text), quote=False)


def _fmt(value) -> str:
    return "—" if value is None else f"{value:.3f}"


EDGE_STYLE = {   # status of the child -> (trace name, line); later entries are drawn on top
    "unreached": ("unreached edges", dict(color=style.EDGE, width=1, dash="dot")),
    "rejected": ("rejected edges", dict(color=style.REJECTED, width=1.5, dash="dot")),
    "bonus": ("bonus edge", dict(color=style.BONUS, width=3)),
    "accepted": ("accepted edges", dict(color=style.DRAFT, width=4)),
}
NODE_STYLE = {   # status -> (symbol, size, outline colour, outline width, label colour)
    "accepted": ("circle", 16, style.DRAFT, 3.0, style.DRAFT),
    "rejected": ("square", 13, style.REJECTED, 2.5, style.REJECTED),
    "unreached": ("circle", 11, style.UNREACHED_LINE, 1.0, "#4b5563"),
}


def _empty_figure(step: StepEvent | None, title: str | None, height: int | None) -> go.Figure:
    caption = ("no draft tree: vanilla decoding (one token per target forward)"
               if step is not None and step.method == "vanilla" else
               "no draft tree: the prefill reads the prompt and yields the first token"
               if step is not None and step.prefill else "no step yet")
    layout = dict(style.BASE_LAYOUT, height=height or MIN_HEIGHT, uirevision="tree", showlegend=False,
                  xaxis=dict(visible=False), yaxis=dict(visible=False),
                  title=dict(text=title or "draft tree", x=0.01),
                  annotations=[dict(text=caption, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")])
    return style.fast_figure([], layout)


def tree_traces(step: StepEvent, bonus_text: str | None = None, fold: bool | None = None,
                max_siblings: int = MAX_SIBLINGS, show_colorbar: bool = True,
                axes: tuple[str, str] = ("x", "y")) -> tuple[list[dict], TreeLayout]:
    """The traces of one step's tree (edges first, then nodes; the accepted path last within
    each) and the outline they were drawn on. ``axes`` puts them on other subplot axes."""
    tree = step.tree
    n = len(tree)
    bonus_parent = _bonus_parent(step)
    fold = n > FOLD_ABOVE if fold is None else fold
    lay = tree_layout(step, bonus_parent, fold, max_siblings)
    on = dict(xaxis=axes[0], yaxis=axes[1])

    # Edges: elbows (down from the parent, then right into the child), one trace per status.
    lines = {name: ([], []) for name in EDGE_STYLE}
    for k in lay.rows[1:]:
        kind = ("bonus" if k == BONUS_ID else "unreached" if isinstance(k, tuple) else tree.status[k])
        (x0, y0), (x1, y1) = lay.xy(lay.parent[k]), lay.xy(k)
        xs, ys = lines[kind]
        xs += [x0, x0, x1, None]
        ys += [y0, y1, y1, None]
    data = [dict(type="scatter", name=name, x=lines[kind][0], y=lines[kind][1], mode="lines",
                 hoverinfo="skip", line=line, **on)
            for kind, (name, line) in EDGE_STYLE.items() if lines[kind][0]]

    # Draft nodes: fill = the head's q for every one of its own; a node copied by prompt lookup
    # (``tree.source``) has no model's q and is filled LOOKUP_FILL, in a trace of its own.
    # Accepted nodes last so they sit on top.
    drawn = sorted((k for k in lay.rows if isinstance(k, int)), key=lambda i: (tree.status[i] == "accepted", i))
    source = tree.source or [None] * n
    p = tree.p if tree.p is not None else [None] * n

    def hover(i: int) -> str:
        who = (f"<br>q (the head's probability of it here): {_fmt(tree.q[i])}" if source[i] is None else
               "<br>copied by prompt lookup: what followed the text's last few tokens where they occurred "
               "before (no model scored it)")
        return (f"<b>{_quoted(tree.texts[i])}</b> (id {tree.tokens[i]})<br>status: {tree.status[i]}"
                f"<br>depth {tree.depths[i]}, position P+{tree.depths[i]}{who}"
                f"<br>p (the target's probability of it): {_fmt(p[i])}"
                f"<br>path confidence (product of q from the root): {_fmt(tree.confidence[i])}")

    colorbar = dict(title=dict(text="q: how sure the head was", side="right"), thickness=10, x=1.0,
                    xref="container", xanchor="right", lenmode="pixels", len=160, y=1.0, yanchor="top",
                    tickvals=[-3, -2, -1, 0], ticktext=["0.001", "0.01", "0.1", "1"])
    for name, nodes in (("nodes", [i for i in drawn if source[i] is None]),
                        ("copied nodes", [i for i in drawn if source[i] is not None])):
        if not nodes and name != "nodes":
            continue
        labels = [show_token(tree.texts[i], limit=LABEL_CHARS) for i in nodes]
        labels = [f"<b>{t}</b>" if tree.status[i] == "accepted" else t for t, i in zip(labels, nodes)]
        st = [NODE_STYLE[tree.status[i]] for i in nodes]
        fill = (dict(color=[q_colour(tree.q[i]) for i in nodes], cmin=math.log10(Q_MIN), cmax=0.0,
                     colorscale=style.CONFIDENCE_SCALE, showscale=show_colorbar, colorbar=colorbar)
                if name == "nodes" else dict(color=[style.LOOKUP_FILL] * len(nodes)))
        data.append(dict(
            type="scatter", name=name, x=[lay.xy(i)[0] for i in nodes], y=[lay.xy(i)[1] for i in nodes],
            customdata=nodes, mode="markers+text", text=labels, textposition="middle right", cliponaxis=False,
            textfont=dict(size=FONT_PX, family="monospace", color=[s[4] for s in st]),
            hovertext=[hover(i) for i in nodes], hoverinfo="text",
            marker=dict(**fill, opacity=1.0, symbol=[s[0] for s in st], size=[s[1] for s in st],
                        line=dict(color=[s[2] for s in st], width=[s[3] for s in st])), **on))

    # Folds: one grey node per path node counting what hangs there undrawn.
    folds = [k for k in lay.rows if isinstance(k, tuple)]
    if folds:
        def fold_hover(spine: int) -> str:
            hidden = lay.folded[spine]
            direct = sum(1 for h in hidden if tree.parents[h] == spine)
            where = "the root" if spine < 0 else _quoted(tree.texts[spine])
            return (f"{len(hidden)} more nodes under {where}: {direct} other "
                    f"children and {len(hidden) - direct} nodes below its drawn alternatives, "
                    f"{sum(tree.status[h] == 'rejected' for h in hidden)} rejected, "
                    f"{sum(tree.status[h] == 'unreached' for h in hidden)} unreached")
        data.append(dict(type="scatter", name="folds", x=[lay.xy(k)[0] for k in folds], y=[lay.xy(k)[1] for k in folds],
                         customdata=[len(lay.folded[k[1]]) for k in folds], mode="markers+text",
                         text=[f"+{len(lay.folded[k[1]])} more" for k in folds], textposition="middle right",
                         cliponaxis=False, textfont=dict(size=FONT_PX, family="monospace", color="#6b7280"),
                         hovertext=[fold_hover(k[1]) for k in folds], hoverinfo="text",
                         marker=dict(size=11, symbol="circle", color="#f3f4f6", line=dict(color=style.EDGE, width=1)),
                         **on))

    # The root (last committed token) and the bonus token (the target's own node).
    data.append(dict(type="scatter", name="root", x=[0.0], y=[0.0], mode="markers+text", text=["root"],
                     textposition="middle right", cliponaxis=False,
                     textfont=dict(size=FONT_PX, family="monospace"), hoverinfo="text",
                     hovertext=[f"root: the last committed token (id {tree.root_token}), position P"],
                     marker=dict(size=14, symbol="square", color=style.ROOT), **on))
    if bonus_parent is not None:
        if bonus_text is None:
            bonus_text = split_step_text(step)[1]
        x, y = lay.xy(BONUS_ID)
        data.append(dict(type="scatter", name="bonus", x=[x], y=[y], mode="markers+text",
                         text=[f"<b>{show_token(bonus_text, limit=LABEL_CHARS)}</b>"], textposition="middle right",
                         cliponaxis=False, textfont=dict(size=FONT_PX, family="monospace", color=style.BONUS),
                         hoverinfo="text",
                         hovertext=[f"<b>{_quoted(bonus_text)}</b> (id {step.bonus})<br>bonus token: the "
                                    "target's own choice after the accepted path"],
                         marker=dict(size=16, symbol="diamond", color=style.BONUS), **on))
    return data, lay


def tree_height(lay: TreeLayout) -> int:
    """Pixels that give every outline row ``ROW_PX``."""
    return max(MIN_HEIGHT, MARGIN["t"] + MARGIN["b"] + ROW_PX * len(lay.rows))


def tree_axes(lay: TreeLayout, height: int) -> tuple[dict, dict]:
    """x: depth columns, labelled on top; y: one unit per row, scaled so a row is at least
    ``ROW_PX`` pixels (``height`` is the figure's)."""
    rows = len(lay.rows)
    plot_px = height - MARGIN["t"] - MARGIN["b"]
    units = max(rows, plot_px / ROW_PX)        # a taller figure than needed leaves empty rows below
    columns = max(lay.column.values())
    xaxis = dict(range=[-0.3, max(columns, MIN_COLUMNS) + 0.3], side="top", showgrid=False, zeroline=False, fixedrange=True,
                 tickvals=list(range(columns + 1)), ticktext=["root"] + [f"depth {d}" for d in range(1, columns + 1)],
                 tickfont=dict(size=10, color="#6b7280"))
    yaxis = dict(range=[-units + 0.5, 0.5], visible=False, fixedrange=True)
    return xaxis, yaxis


def tree_figure(step: StepEvent | None, title: str | None = None, bonus_text: str | None = None,
                height: int | None = None, fold: bool | None = None, max_siblings: int = MAX_SIBLINGS,
                number: int | None = None) -> go.Figure:
    """The figure for one step's draft tree (an empty, captioned figure when there is none).

    ``bonus_text`` labels the bonus node; by default it is the step text after the accepted
    draft tokens (see ``stream.split_step_text``), so no tokenizer is needed. ``height``:
    None fits the rows (``ROW_PX`` each); a smaller value is raised to that. ``fold``: None
    folds trees of more than ``FOLD_ABOVE`` nodes, True / False force it. ``number``: the
    step's number in the title as the page counts it (default: the record's ``step``).
    """
    if step is None or step.tree is None or not len(step.tree):
        return _empty_figure(step, title, height)
    data, lay = tree_traces(step, bonus_text, fold, max_siblings)
    height = max(height or 0, tree_height(lay))
    xaxis, yaxis = tree_axes(lay, height)
    widest = max(label_width_px(t) for tr in data if "text" in tr for t in tr["text"])
    n, k = len(step.tree), len(step.accepted)
    shown = sum(isinstance(r, int) for r in lay.rows)
    if title is None:
        # two short lines (a phone's 330 px hold each): what happened, then who drafted and what is folded
        by = f"drafted by the {DRAFTER_NAMES.get(step.drafter, step.drafter)}" if step.drafter else ""
        fold_note = f"showing {shown} of {n}: grey +N nodes count the rest" if shown < n else ""
        sub = " · ".join(t for t in (by, fold_note) if t)
        title = (f"step {step.step if number is None else number}: {n} draft nodes, {k} accepted"
                 f"{' + bonus' if BONUS_ID in lay.rows else ''}")
    else:
        sub = ""
    layout = dict(style.BASE_LAYOUT, height=height, uirevision="tree", showlegend=False, hovermode="closest",
                  margin=dict(MARGIN, r=int(widest) + 24 + COLORBAR_PX),
                  # pinned to the figure's top edge in pixels: a tall figure's fraction put it out of view
                  title=dict(text=title, x=0.01, xanchor="left", y=1.0, yref="container", yanchor="top",
                             pad=dict(t=6), font=dict(size=14)),
                  xaxis=xaxis, yaxis=yaxis,
                  # the second line (drafter, what is folded) under the title, above the depth labels
                  annotations=[dict(text=sub, showarrow=False, xref="paper", yref="paper", x=0.0, y=1.0,
                                    xanchor="left", yanchor="bottom", yshift=MARGIN["t"] - 46,
                                    font=dict(size=11, color="#4b5563"))] if sub else [])
    return style.fast_figure(data, layout)
