"""How ONE target forward verifies a whole draft tree, drawn from a step record alone.

Two pictures of the verify forward over [root, node 0, ..., node N-1] (``Engine.verify``):

- the *tree attention mask*: row = a query token, column = a key it may attend to. Every row
  sees the committed context (the prefix), the root, its own ancestors and itself, and
  nothing else; its position id is P + depth, where P is the root's position (the committed
  length minus one). So a node is computed exactly as if its own path were the sequence,
  and all paths share one forward;
- the *KV cache* before and after the step: the forward writes 1 + N new slots; acceptance
  keeps the root and the accepted path, moved to contiguous slots (``kv.keep_positions``),
  and drops the rest. A rejected branch costs compute in this forward, but no memory after.

A record carries no prefix length, so positions are written relative to P ("P+2"); pass
``prefix_len`` (the root's position) when the caller knows it, to print absolute numbers.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import plotly.graph_objects as go

from app.engine.events import DraftTreeRecord, StepEvent
from app.viz import style
from app.viz.glossary import term
from app.viz.stream import split_step_text
from app.viz.tree import show_token
from app.viz.tree_layout import accepted_path, display_order

TAIL_SLOTS = 3        # committed-context slots drawn before the root (the rest of the prefix is "…")
MAX_NODES = 24        # mask view: nodes drawn before the rest are left out (None: all, scroll)
CELL_PX = 18
LABEL_CHARS = 8
# a two-line title anchored at the figure's top: plotly anchors its first line ~12 px too high
TITLE_PAD_PX = 20
MAX_SLOTS = 30        # KV view: above this many tree slots, runs of dropped slots collapse

# the mask's cell kinds (heatmap z) and their colours
MASKED, PREFIX, ANCESTOR, SELF = 0, 1, 2, 3
CELL_COLOURS = {MASKED: "#f1f5f9", PREFIX: "#cbd5e1", ANCESTOR: "#93c5fd", SELF: "#1d4ed8"}
CELL_NAMES = {MASKED: "masked", PREFIX: "committed context", ANCESTOR: "root / ancestor", SELF: "itself"}


def _pos(offset: int, prefix_len: int | None) -> str:
    """Position P + offset, absolute when P is known."""
    if prefix_len is not None:
        return str(prefix_len + offset)
    return "P" if offset == 0 else f"P{offset:+d}".replace("-", "−")


def _tok(text: str) -> str:
    return show_token(text, limit=LABEL_CHARS)


# --- the tree attention mask ------------------------------------------------------------------

@dataclass(frozen=True)
class MaskGrid:
    """The drawn mask. Rows: [root] + ``nodes``; columns: ``TAIL_SLOTS`` committed-context
    slots, the root, then ``nodes``. ``kind[r][c]`` is MASKED / PREFIX / ANCESTOR / SELF."""

    nodes: list[int]          # node indices in display order (accepted path first, ancestors first)
    hidden: int               # nodes left out (``max_nodes``); ancestors of drawn nodes never are
    kind: list[list[int]]

    @property
    def allowed(self) -> list[list[bool]]:
        return [[k != MASKED for k in row] for row in self.kind]


def mask_grid(tree: DraftTreeRecord, max_nodes: int | None = MAX_NODES) -> MaskGrid:
    """Who may attend to whom in the verify forward, from the record's parents alone.

    The nodes are taken in ``display_order`` (depth first, accepted child first), cut after
    ``max_nodes``: every ancestor comes before its descendants there, so a cut never drops a
    drawn node's ancestor."""
    order = display_order(tree.parents, tree.status, tree.confidence)
    nodes = order if max_nodes is None else order[:max_nodes]
    col = {n: TAIL_SLOTS + 1 + j for j, n in enumerate(nodes)}
    width = TAIL_SLOTS + 1 + len(nodes)
    kind = [[PREFIX] * TAIL_SLOTS + [SELF] + [MASKED] * len(nodes)]          # the root's row
    for n in nodes:
        row = [PREFIX] * TAIL_SLOTS + [ANCESTOR] + [MASKED] * len(nodes)
        row[col[n]] = SELF
        a = tree.parents[n]
        while a >= 0:
            row[col[a]] = ANCESTOR
            a = tree.parents[a]
        assert len(row) == width
        kind.append(row)
    return MaskGrid(nodes=nodes, hidden=len(order) - len(nodes), kind=kind)


def _cell_reason(tree: DraftTreeRecord, row: int, col: int, kind: int) -> str:
    """Why row node ``row`` may or may not see column node ``col`` (-1 = the root)."""
    if kind == SELF:
        return "itself"
    if kind == ANCESTOR:
        return "the root: every path starts there" if col < 0 else "an ancestor: part of this node's own past"
    if row >= 0 and col >= 0 and tree.parents[row] == tree.parents[col]:
        return "masked: a sibling, an alternative to this node, never its past"
    a = tree.parents[col] if col >= 0 else -1
    while a >= 0:
        if a == row:
            return "masked: a descendant, this node's possible future"
        a = tree.parents[a]
    return "masked: another branch"


def mask_figure(step: StepEvent | None, max_nodes: int | None = MAX_NODES, prefix_len: int | None = None,
                title: str | None = None, number: int | None = None) -> go.Figure:
    """The verify forward's tree attention mask for one step, as a heatmap: rows are the query
    tokens [root, nodes], columns the keys [context tail, root, nodes]; the accepted path's
    rows come first and are outlined in green; labels carry tokens and position ids."""
    if step is None or step.tree is None or not len(step.tree):
        return _empty("tree attention mask", step)
    tree = step.tree
    grid = mask_grid(tree, max_nodes)
    nodes = grid.nodes
    path = set(accepted_path(step))
    row_ids = [-1] + nodes
    col_ids = [None] * TAIL_SLOTS + [-1] + nodes
    depth = lambda n: 0 if n < 0 else tree.depths[n]   # noqa: E731
    text = lambda n: "root" if n < 0 else _tok(tree.texts[n])   # noqa: E731

    def on_path(label: str, node) -> str:
        return f"<b><span style='color:{style.DRAFT}'>{label}</span></b>" if node in path else label

    row_labels = [on_path(f"{text(r)} · pos {_pos(depth(r), prefix_len)}", r) for r in row_ids]
    col_labels = ([f"ctx {_pos(o, prefix_len)}" for o in range(-TAIL_SLOTS, 0)]
                  + [on_path(text(c), c) for c in col_ids[TAIL_SLOTS:]])
    hover = []
    for r, row in zip(row_ids, grid.kind):
        line = []
        for j, (c, k) in enumerate(zip(col_ids, row)):
            who = f"{html.escape(text(r))} (pos {_pos(depth(r), prefix_len)})"
            if c is None:
                line.append(f"{who} sees committed context slot {_pos(j - TAIL_SLOTS, prefix_len)}")
            else:
                line.append(f"{who} → {html.escape(text(c))} (pos {_pos(depth(c), prefix_len)}): "
                            f"{_cell_reason(tree, r, c, k)}")
        hover.append(line)

    n_rows, n_cols = len(row_ids), len(col_ids)
    scale = [[0.0, CELL_COLOURS[0]], [0.25, CELL_COLOURS[0]], [0.25, CELL_COLOURS[1]], [0.5, CELL_COLOURS[1]],
             [0.5, CELL_COLOURS[2]], [0.75, CELL_COLOURS[2]], [0.75, CELL_COLOURS[3]], [1.0, CELL_COLOURS[3]]]
    data = [dict(type="heatmap", name="mask", z=grid.kind, zmin=-0.5, zmax=3.5, colorscale=scale, showscale=False,
                 xgap=1, ygap=1, text=hover, hoverinfo="text", meta=dict(rows=row_ids, columns=col_ids))]
    k = len(path)
    shapes = [dict(type="line", x0=TAIL_SLOTS - 0.5, x1=TAIL_SLOTS - 0.5, y0=-0.5, y1=n_rows - 0.5,
                   line=dict(color="#475569", width=2)),
              dict(type="line", x0=TAIL_SLOTS + 0.5, x1=TAIL_SLOTS + 0.5, y0=-0.5, y1=n_rows - 0.5,
                   line=dict(color="#475569", width=1, dash="dot"))]
    if k:   # the accepted path's rows (1..k in display order) and the block they attend to
        shapes.append(dict(type="rect", x0=-0.5, x1=TAIL_SLOTS + k + 0.5, y0=0.5, y1=k + 0.5,
                           line=dict(color=style.DRAFT, width=3)))
    key = "   ".join(f"<span style='color:{CELL_COLOURS[c]}'>■</span> {CELL_NAMES[c]}" for c in (PREFIX, ANCESTOR, SELF))
    key += f"   <span style='color:#94a3b8'>□</span> masked   <span style='color:{style.DRAFT}'>▭</span> accepted path"
    shown = f" (first {len(nodes)} of {len(tree)} nodes)" if grid.hidden else ""
    height = 150 + CELL_PX * n_rows
    layout = dict(style.BASE_LAYOUT, height=height, uirevision="mask", showlegend=False, shapes=shapes,
                  margin=dict(l=150, r=20, t=130, b=40),
                  title=dict(text=title or f"step {step.step if number is None else number}: tree attention mask<br>"
                             f"<sup>one forward over {len(tree) + 1} tokens{shown}</sup>", x=0.01, xanchor="left",
                             y=1.0, yref="container", yanchor="top", pad=dict(t=TITLE_PAD_PX), font=dict(size=14)),
                  xaxis=dict(side="top", tickvals=list(range(n_cols)), ticktext=col_labels, tickangle=-90,
                             tickfont=dict(size=10, family="monospace"), showgrid=False, zeroline=False,
                             constrain="domain", fixedrange=True),
                  yaxis=dict(tickvals=list(range(n_rows)), ticktext=row_labels, autorange="reversed",
                             tickfont=dict(size=10, family="monospace"), showgrid=False, zeroline=False,
                             scaleanchor="x", constrain="domain", fixedrange=True),
                  annotations=[dict(text=key, showarrow=False, xref="paper", yref="paper", x=0, y=0, yshift=-24,
                                    xanchor="left", yanchor="top", font=dict(size=11))])
    if grid.hidden:
        layout["annotations"].append(dict(
            text=f"+{grid.hidden} more nodes not drawn", showarrow=False, xref="paper", yref="paper", x=1, y=0,
            yshift=-24, xanchor="right", yanchor="top", font=dict(size=11, color="#6b7280")))
    return style.fast_figure(data, layout)


def lit_tree_cells(grid: MaskGrid) -> int:
    """Lit cells of the node rows in the root and node columns (not the context tail): each
    node row lights its ancestors, itself and the root, depth + 1 cells."""
    return sum(k != MASKED for row in grid.kind[1:] for k in row[TAIL_SLOTS:])


# --- the KV cache -----------------------------------------------------------------------------

@dataclass(frozen=True)
class KVPlan:
    """The target cache over one step, in slots relative to the root's slot P."""

    path: list[int]           # accepted node indices, root's child first
    kept_from: list[int]      # after acceptance slot P + j holds what the forward wrote at P + kept_from[j]
    length_before: int        # P: the committed context minus the root (the root is fed by this forward)
    length_verified: int      # P + 1 + N after the verify forward wrote [root, node 0, ..., node N-1]
    length_after: int         # P + 1 + k after acceptance kept the root and the k accepted nodes

    @property
    def kept(self) -> int:
        return len(self.kept_from)


def kv_plan(step: StepEvent, prefix_len: int = 0) -> KVPlan:
    """What ``Engine.commit`` keeps: node i was written at slot P + 1 + i (the verify forward's
    row order), and ``kv.keep_positions(cache, P, [0] + [1 + i for i in path])`` moves the root
    and the path to P, P + 1, ... . Lengths count from ``prefix_len`` (0: relative to P)."""
    tree = step.tree
    path = accepted_path(step)
    n = len(tree) if tree is not None else 0
    return KVPlan(path=path, kept_from=[0] + [1 + i for i in path], length_before=prefix_len,
                  length_verified=prefix_len + 1 + n, length_after=prefix_len + 1 + len(path))


def _slot_runs(n: int, kept: set[int], max_slots: int) -> list[tuple[int, int]]:
    """The verify row's drawn cells as (first node, count): one cell per node, except that for
    more than ``max_slots`` nodes each run of 3 or more dropped nodes collapses into one cell."""
    cells, i = [], 0
    while i < n:
        j = i
        while n > max_slots and j < n and j not in kept:
            j += 1
        if j - i >= 3:
            cells.append((i, j - i))
            i = j
        else:
            cells.append((i, 1))
            i += 1
    return cells


def kv_figure(step: StepEvent | None, prefix_len: int | None = None, max_slots: int = MAX_SLOTS,
              title: str | None = None, number: int | None = None) -> go.Figure:
    """The target KV cache at the start of the step, after the verify forward, and after
    acceptance: the root and the accepted path kept (green, moved to contiguous slots by
    the arrows), every other node's slot dropped (red)."""
    if step is None or step.tree is None or not len(step.tree):
        return _empty("KV cache", step)
    tree = step.tree
    plan = kv_plan(step)
    P = prefix_len
    kept_nodes = set(plan.path)
    cells = _slot_runs(len(tree), kept_nodes, max_slots)
    x_of_node = {}
    x = TAIL_SLOTS + 1.0
    for first, count in cells:
        x_of_node[first] = x
        x += 1.0 if count == 1 else 1.6
    rows = {"start": 2, "verify": 1, "after": 0}
    data = []

    def cellset(name, xs, ys, texts, hovers, colour, line, symbol="square", size=18):
        data.append(dict(type="scatter", name=name, x=xs, y=ys, mode="markers", hovertext=hovers, hoverinfo="text",
                         marker=dict(symbol=symbol, size=size, color=colour, line=line), customdata=texts))

    # context tail: the same in every row
    for rname, y in rows.items():
        cellset(f"context ({rname})", list(range(TAIL_SLOTS)), [y] * TAIL_SLOTS, [None] * TAIL_SLOTS,
                [f"committed context slot {_pos(o, P)}" for o in range(-TAIL_SLOTS, 0)], CELL_COLOURS[PREFIX],
                dict(color="#94a3b8", width=1))
    root_x = float(TAIL_SLOTS)
    for rname in ("verify", "after"):
        cellset(f"root ({rname})", [root_x], [rows[rname]], ["root"],
                [f"slot {_pos(0, P)}: the root (id {tree.root_token}), written by this forward, always kept"],
                style.ROOT, dict(color="#374151", width=1))
    # the verify row: kept nodes green, dropped nodes red (runs collapsed)
    kx, kh, dx, dh, dtext = [], [], [], [], []
    for first, count in cells:
        if count == 1 and first in kept_nodes:
            kx.append(x_of_node[first])
            kh.append(f"slot {_pos(1 + first, P)}: {html.escape(repr(tree.texts[first]))} (node {first}, depth "
                      f"{tree.depths[first]}), accepted: kept, moves to slot {_pos(1 + plan.path.index(first), P)}")
        else:
            dx.append(x_of_node[first])
            nodes = range(first, first + count)
            if count == 1:
                dh.append(f"slot {_pos(1 + first, P)}: {html.escape(repr(tree.texts[first]))} (node {first}), "
                          f"{tree.status[first]}: dropped")
            else:
                dh.append(f"slots {_pos(1 + first, P)} … {_pos(first + count, P)}: {count} nodes "
                          f"({sum(tree.status[i] == 'rejected' for i in nodes)} rejected, "
                          f"{sum(tree.status[i] == 'unreached' for i in nodes)} unreached): dropped")
            dtext.append(count)
    cellset("kept (verify)", kx, [rows["verify"]] * len(kx), [None] * len(kx), kh, style.DRAFT,
            dict(color="#14532d", width=1))
    if dx:
        cellset("dropped (verify)", dx, [rows["verify"]] * len(dx), dtext, dh, "#fee2e2",
                dict(color=style.REJECTED, width=1.5), symbol="square-x")
    # the after row: root + path, contiguous
    ax = [root_x + 1 + j for j in range(len(plan.path))]
    cellset("kept (after)", ax, [rows["after"]] * len(ax), [None] * len(ax),
            [f"slot {_pos(1 + j, P)}: {html.escape(repr(tree.texts[i]))}, was slot {_pos(1 + i, P)}"
             for j, i in enumerate(plan.path)], style.DRAFT, dict(color="#14532d", width=1))

    annotations = []
    for j, i in enumerate(plan.path):           # arrows: old slot -> new slot
        annotations.append(dict(x=ax[j], y=rows["after"] + 0.22, ax=x_of_node[i], ay=rows["verify"] - 0.22,
                                xref="x", yref="y", axref="x", ayref="y", showarrow=True, arrowhead=2,
                                arrowsize=1, arrowwidth=1.5, arrowcolor=style.DRAFT, text=""))
    for first, count in cells:                   # counts on collapsed runs
        if count > 1:
            annotations.append(dict(x=x_of_node[first], y=rows["verify"] - 0.32, text=f"×{count}", showarrow=False,
                                    font=dict(size=10, color=style.REJECTED)))
    labels = [(root_x, "root", style.ROOT)] + [(x_of_node[i], _tok(tree.texts[i]), style.DRAFT) for i in plan.path]
    after = [(root_x, "root", style.ROOT)] + [(ax[j], _tok(tree.texts[i]), style.DRAFT) for j, i in enumerate(plan.path)]
    for (xa, label, colour), y, anchor in ([(c, rows["verify"] + 0.28, "bottom") for c in labels]
                                           + [(c, rows["after"] - 0.28, "top") for c in after]):
        annotations.append(dict(x=xa, y=y, text=label, showarrow=False, textangle=-90, yanchor=anchor,
                                font=dict(size=10, family="monospace", color=colour)))
    n, k = len(tree), len(plan.path)
    if len(step.new_tokens) > len(step.accepted):   # the bonus token: next step's root, not cached yet
        bx = root_x + 1 + k
        cellset("bonus (after)", [bx], [rows["after"]], [None],
                [f"the bonus token {html.escape(repr(split_step_text(step)[1]))} (id {step.bonus}): not in the "
                 "cache yet; the next step's verify forward feeds it as the root"], "white",
                dict(color=style.BONUS, width=2), symbol="diamond-open", size=16)
        annotations.append(dict(x=bx, y=rows["after"] - 0.28, text="bonus (next root)", showarrow=False,
                                textangle=-90, yanchor="top", font=dict(size=10, color=style.BONUS)))
    x_end = max(x, root_x + 2 + k)
    annotations.append(dict(x=TAIL_SLOTS - 0.5, y=rows["start"] + 0.45, text="… committed context", showarrow=False,
                            xanchor="right", font=dict(size=10, color="#6b7280")))
    ticks = [f"start of step<br>length {_pos(0, P)}",
             f"after verify<br>length {_pos(1 + n, P)}: +root +{n} nodes",
             f"after accept<br>length {_pos(1 + k, P)}: root + {k} kept"]
    layout = dict(style.BASE_LAYOUT, height=360, uirevision="kv", showlegend=False, annotations=annotations,
                  margin=dict(l=190, r=20, t=56, b=20), hovermode="closest",
                  title=dict(text=title or f"step {step.step if number is None else number}: target KV cache<br>"
                             f"<sup>{1 + n} slots written, {1 + k} kept</sup>", x=0.01, xanchor="left", y=1.0,
                             yref="container", yanchor="top", pad=dict(t=TITLE_PAD_PX), font=dict(size=14)),
                  xaxis=dict(visible=False, range=[-0.7, max(x_end, 12)], fixedrange=True),
                  yaxis=dict(tickvals=list(rows.values()), ticktext=ticks,
                             range=[-1.2, 2.6], showgrid=False, zeroline=False, fixedrange=True))
    return style.fast_figure(data, layout)


# --- captions --------------------------------------------------------------------------------

def mask_caption(step: StepEvent | None = None) -> str:
    """Why a sibling cannot see its sibling."""
    text = ("Each row is one token of the verify forward. It may look at the committed context, the root, "
            "its own ancestors and itself, and at position P + depth — exactly what it would see if its "
            "path were the text. A sibling is an alternative to it, never its past, so it is masked: "
            "every path of the tree is checked at once, in one forward.")
    if step is not None and step.tree is not None and len(step.tree):
        text += (f" Here: {len(step.tree) + 1} rows, {lit_tree_cells(mask_grid(step.tree, None))} "
                 f"lit cells among the root and node columns.")
    return text


def kv_caption(step: StepEvent | None = None) -> str:
    """Why rejected branches cost compute but no memory afterwards."""
    text = ("The verify forward writes a key/value slot for the root and every draft node. Acceptance keeps "
            "the root and the accepted path, moved to contiguous slots, and drops every other slot: a "
            "rejected branch cost compute in this one forward but holds no memory afterwards. The draft "
            "head's cache does the same each step: its in-step entries are cropped after drafting, and the "
            "next step it reads the root and the accepted tokens with the target's true features.")
    if step is not None and step.tree is not None and len(step.tree):
        k = len(accepted_path(step))
        text += f" Here: {len(step.tree) + 1} slots written, {1 + k} kept, {len(step.tree) - k} dropped."
    return text


def tree_caption(step: StepEvent | None = None) -> str:
    """What the tree view shows: the colour said once in words, the shapes that tell a node's
    fate without colour, and the token marks (glossary terms hover)."""
    return (f"**Colour** = {term('q')}, how sure the draft head was of that token at its branch: yellow = sure "
            "(q near 1), dark purple = a long shot (q ≈ 0.001), on a log scale. **Shape** tells what happened, "
            "without colour: ● thick green outline = accepted; ■ red outline, dotted edge = rejected (the target, "
            f"by its own {term('p')}, chose another token); small ○ thin grey, dotted edge = never reached (an "
            f"ancestor was rejected); ◆ blue = the {term('bonus token')}. All checked in one "
            f"{term('target forward')}. In labels {term('␣')} is a space, ↵ a new line, ⟨end of answer⟩ the "
            "model's end-of-answer mark.")


def _empty(what: str, step: StepEvent | None) -> go.Figure:
    caption = ("vanilla decoding: one token per forward, no tree" if step is not None and step.method == "vanilla"
               else "the prefill: the prompt in one forward, no tree" if step is not None and step.prefill
               else "no step yet")
    return style.fast_figure([], dict(style.BASE_LAYOUT, height=220, title=dict(text=what, x=0.01),
                                      xaxis=dict(visible=False), yaxis=dict(visible=False),
                                      annotations=[dict(text=caption, showarrow=False, x=0.5, y=0.5,
                                                        xref="paper", yref="paper")]))
