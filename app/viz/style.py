"""The colours and symbols of the whole app, in one place, so the legend can never drift from
what the figures and the token stream actually draw. A decoding method's own colour is its
entry in the registry (``app.engine.drafters.registry.METHODS``)."""
from __future__ import annotations

import plotly.graph_objects as go

from app.engine.drafters.registry import METHODS

DRAFT = "#15803d"        # an accepted draft token (the head guessed it, the target agreed)
DRAFT_BG = "#dcfce7"
BONUS = "#1d4ed8"        # the target's own bonus token, produced by the verify forward
BONUS_BG = "#dbeafe"
REJECTED = "#dc2626"     # a node the target looked at and refused (its outline and edge)
UNREACHED_LINE = "#6b7280"  # outline of a node below a rejected one: never checked
ROOT = "#6b7280"         # the last committed token, where the tree hangs
EDGE = "#9ca3af"
VANILLA = METHODS["vanilla"].colour   # the vanilla curve in the speed race (each method's colour: the registry)
EAGLE = METHODS["dynamic"].colour     # the EAGLE curve in the speed race: EAGLE-2's, the accepted drafts' green

CONFIDENCE_SCALE = "Viridis"  # a node's own q, on the fixed log scale of app/viz/tree.py (0.001..1)
LOOKUP_FILL = "#fb923c"  # a node copied from the context by prompt lookup (no model's q: outside the scale)

# Small figures: no template download, no modebar clutter, fixed margins.
BASE_LAYOUT = dict(
    template="none",
    margin=dict(l=40, r=20, t=36, b=36),
    paper_bgcolor="white",
    plot_bgcolor="white",
    font=dict(size=12),
)



def fast_figure(data: list[dict], layout: dict) -> go.Figure:
    """A plotly figure from plain trace/layout dicts, skipping plotly's per-property validation.

    Why: the live tree and race figures are rebuilt several times a second while the engine
    decodes; validated construction costs ~20 ms of Python per tree figure (measured, 24
    nodes), GIL time taken straight from the engine on a 2-core CPU, against ~5 ms without.
    Plotly Express builds its figures the same way. ``tests/test_viz.py`` re-validates every
    figure builder's output, so a misspelt property still fails a test.
    """
    return go.Figure(dict(data=data, layout=layout), _validate=False)


LEGEND_ROWS = (
    ("accepted draft token", f"background:{DRAFT_BG};border-bottom:2px solid {DRAFT}",
     "the draft head proposed it and the target's verify forward agreed"),
    ("bonus token", f"background:{BONUS_BG};border-bottom:2px solid {BONUS}",
     "the target's own next token, free with every verify forward"),
    ("rejected node", f"border:2px solid {REJECTED};background:#3b528b",
     "square, red outline: the target checked this draft token and chose another one"),
    ("unreached node", f"border:1px solid {UNREACHED_LINE};border-radius:50%;background:#21918c",
     "small circle, thin outline, dotted edge: an ancestor was rejected, so the target never got to it"),
    ("node colour", "background:linear-gradient(90deg,#440154,#21918c,#fde725)",
     "q, how sure the draft head was of the node's token at its branch, on a log scale: 0.001 (dark) to 1 "
     "(yellow); the path's confidence (product of q) is in the hover; the shape, outline and edge tell the "
     "node's fate"),
    ("copied node", f"background:{LOOKUP_FILL}",
     "orange: not the head's guess but prompt lookup's, what followed the text's last few tokens where "
     "they occurred before (the auto tree verifies such a branch beside the head's)"),
    ("␣ ↵ ⟨end of answer⟩", "background:#f3f4f6",
     "how tokens are shown: ␣ a leading space, ↵ a new line, ⟨end of answer⟩ the model's end mark"),
)


def legend_html() -> str:
    """A small HTML legend for every colour used by the stream and the tree."""
    rows = "".join(
        f'<li><span class="swatch" style="{style}"></span><b>{name}</b> — {meaning}</li>'
        for name, style, meaning in LEGEND_ROWS)
    return f'<ul class="legend">{rows}</ul>'
