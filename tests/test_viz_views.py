"""The teaching views read from step records: the tree outline (legible at 60 nodes), the
tree attention mask and the KV cache of one verify forward, and the A/B comparison.

Geometry is checked in pixels from the figure data alone: a label's box starts right of its
marker and is (characters x font size) wide — 1 em per character, wider than any real glyph
of the monospace label font — and one line high."""
from __future__ import annotations

import html
import re

import plotly.graph_objects as go
import pytest
import torch
from hypothesis import given, settings, strategies as st

from app.engine import kv
from app.engine.config import TreeConfig
from app.engine.engine import Engine
from app.engine.events import DraftTreeRecord, StepEvent, acceptance_by_depth, summarize
from app.engine.tree import tree_attention_mask
from app.viz import compare, tree as tree_view, verify_view
from app.viz.tree import tree_figure
from app.viz.tree_layout import display_order, fold_tree
from app.viz.verify_view import TAIL_SLOTS, kv_figure, kv_plan, lit_tree_cells, mask_figure, mask_grid


# --- records ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def paper_run(tiny):
    """A real run with EAGLE-2's paper tree (depth 6, top_k 10, 60 nodes) on the tiny model."""
    target, head = tiny
    *steps, summary = Engine(target, head).generate(prompt_ids=[5, 17, 33, 90], max_new_tokens=16,
                                                    tree=TreeConfig(depth=6, top_k=10, total_tokens=60))
    return steps, summary


@pytest.fixture(scope="module")
def small_run(tiny):
    target, head = tiny
    *steps, summary = Engine(target, head).generate(prompt_ids=[5, 17, 33, 90], max_new_tokens=16,
                                                    tree=TreeConfig(depth=2, top_k=2, total_tokens=3))
    return steps, summary


def big_step(steps) -> StepEvent:
    step = max(steps[1:], key=lambda s: (len(s.tree), len(s.accepted)))
    assert len(step.tree) == 60 and step.accepted
    return step


TEXTS = ["a", " the", "\n", "<b>", "&amp;", "ensurecomputecreate", "超长的词语", " ", "'\"", "x" * 40]


@st.composite
def records(draw, max_nodes: int = 40) -> StepEvent:
    """A random tree with a consistent verification: an accepted path from the root, its
    nodes' other children rejected, everything else unreached."""
    n = draw(st.integers(1, max_nodes))
    parents = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)]
    depths = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    q = [draw(st.floats(0.01, 1.0)) for _ in range(n)]
    conf = []
    for i, p in enumerate(parents):
        conf.append(q[i] * (1.0 if p < 0 else conf[p]))
    end = draw(st.integers(-1, n - 1))          # the last accepted node (-1: none)
    path = []
    while end >= 0:
        path.append(end)
        end = parents[end]
    path = path[::-1]
    spine = {-1} | set(path)
    status = ["accepted" if i in path else "rejected" if parents[i] in spine else "unreached" for i in range(n)]
    texts = [draw(st.sampled_from(TEXTS)) for _ in range(n)]
    tree = DraftTreeRecord(root_token=1, tokens=list(range(10, 10 + n)), texts=texts, parents=parents, depths=depths,
                           q=q, confidence=conf, p=[0.5] * n, status=status)
    accepted = [tree.tokens[i] for i in path]
    return StepEvent(step=3, method="dynamic", tree=tree, accepted=accepted, bonus=7, new_tokens=accepted + [7],
                     text="".join(texts[i] for i in path) + "!")


# --- tree outline geometry ----------------------------------------------------------------------

def _plain(label: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", label))


def label_boxes(fig: go.Figure, width: int) -> list[tuple[float, float, float, float, str]]:
    """(left, top, right, bottom, label) in pixels of every text label, for a figure drawn
    ``width`` pixels wide (its height is fixed by the figure)."""
    lay = fig.layout
    m = lay.margin
    plot_w, plot_h = width - m.l - m.r, lay.height - m.t - m.b
    (x0, x1), (y0, y1) = lay.xaxis.range, lay.yaxis.range
    boxes = []
    for tr in fig.data:
        if not tr.mode or "text" not in tr.mode:
            continue
        assert tr.textposition == "middle right"
        font = tr.textfont.size
        sizes = tr.marker.size if isinstance(tr.marker.size, tuple) else [tr.marker.size] * len(tr.x)
        for x, y, text, size in zip(tr.x, tr.y, tr.text, sizes):
            px = m.l + (x - x0) / (x1 - x0) * plot_w
            py = m.t + (y1 - y) / (y1 - y0) * plot_h
            left = px + size / 2 + 1
            boxes.append((left, py - 0.65 * font, left + len(_plain(text)) * font, py + 0.65 * font, text))
    return boxes


def edge_segments(fig: go.Figure, width: int) -> list[tuple[float, float, float, float]]:
    lay = fig.layout
    m = lay.margin
    plot_w, plot_h = width - m.l - m.r, lay.height - m.t - m.b
    (x0, x1), (y0, y1) = lay.xaxis.range, lay.yaxis.range
    out = []
    for tr in fig.data:
        if tr.mode != "lines":
            continue
        pts = list(zip(tr.x, tr.y))
        for (ax, ay), (bx, by) in zip(pts, pts[1:]):
            if None in (ax, ay, bx, by):
                continue
            out.append(tuple(v for x, y in ((ax, ay), (bx, by))
                             for v in (m.l + (x - x0) / (x1 - x0) * plot_w, m.t + (y1 - y) / (y1 - y0) * plot_h)))
    return out


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _crosses(seg, box) -> bool:
    """Does the segment pass through the box's interior? (Liang-Barsky clipping)"""
    x0, y0, x1, y1 = seg
    left, top, right, bottom = box[:4]
    dx, dy = x1 - x0, y1 - y0
    t0, t1 = 0.0, 1.0
    for p, q in ((-dx, x0 - left), (dx, right - x0), (-dy, y0 - top), (dy, bottom - y0)):
        if p == 0:
            if q <= 0:
                return False
            continue
        t = q / p
        if p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
    return t1 - t0 > 1e-9


def assert_legible(fig: go.Figure) -> None:
    for width in (480, 1200):
        boxes = label_boxes(fig, width)
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not _overlap(a, b), f"labels {a[4]!r} and {b[4]!r} overlap at width {width}"
        for seg in edge_segments(fig, width):
            for box in boxes:
                assert not _crosses(seg, box), f"an edge strikes through {box[4]!r} at width {width}"


def test_paper_tree_labels_never_collide_nor_get_struck_through(paper_run):
    steps, _ = paper_run
    step = big_step(steps)
    for fold in (False, True):
        fig = tree_figure(step, fold=fold)
        assert_legible(fig)
    full = tree_figure(step, fold=False)
    assert len(next(t for t in full.data if t.name == "nodes").x) == 60


@settings(max_examples=40, deadline=None)
@given(records())
def test_random_tree_labels_never_collide_nor_get_struck_through(step):
    assert_legible(tree_figure(step, fold=False))
    assert_legible(tree_figure(step, fold=True, max_siblings=2))


def test_rejected_and_unreached_nodes_keep_their_q_colour(paper_run):
    """Every node's fill is its own q on the log scale (whatever its fate), and the scale's
    range is used: deep nodes are not all one colour, as they were with the path product."""
    step = big_step(paper_run[0])
    fig = tree_figure(step, fold=False)
    nodes = next(t for t in fig.data if t.name == "nodes")
    colour = dict(zip(nodes.customdata, nodes.marker.color))
    for status in ("rejected", "unreached"):
        which = [i for i, s in enumerate(step.tree.status) if s == status]
        assert which, status
        assert [colour[i] for i in which] == pytest.approx([tree_view.q_colour(step.tree.q[i]) for i in which])
    assert nodes.marker.opacity == 1.0
    assert (nodes.marker.cmin, nodes.marker.cmax) == (-3.0, 0.0)
    assert list(nodes.marker.colorbar.ticktext) == ["0.001", "0.01", "0.1", "1"]
    assert "path confidence" in nodes.hovertext[0] and "q (the head's probability" in nodes.hovertext[0]


def test_tokens_are_shown_as_a_reader_sees_them():
    assert tree_view.show_token("<|im_end|>", limit=16) == "⟨end of answer⟩"
    assert tree_view.show_token(" techniques", limit=tree_view.LABEL_CHARS) == "␣techniques"
    assert tree_view.show_token(" strategies", limit=tree_view.LABEL_CHARS) == "␣strategies"


def assert_path_first_and_on_top(step: StepEvent) -> None:
    path = tree_view.accepted_path(step)
    for fold in (False, True):
        fig = tree_figure(step, fold=fold, max_siblings=2)
        nodes = next(t for t in fig.data if t.name == "nodes")
        y = dict(zip(nodes.customdata, nodes.y))
        x = dict(zip(nodes.customdata, nodes.x))
        # first: the path takes the rows right under the root, one column further each
        assert [(x[i], y[i]) for i in path] == [(j + 1.0, -(j + 1.0)) for j in range(len(path))]
        bonus = next(t for t in fig.data if t.name == "bonus")
        assert (bonus.x[0], bonus.y[0]) == (len(path) + 1.0, -(len(path) + 1.0))
        # on top: accepted edges after every other edge trace, accepted nodes last in theirs
        if path:
            names = [t.name for t in fig.data]
            assert names.index("accepted edges") == max(i for i, t in enumerate(fig.data) if t.mode == "lines")
            assert list(nodes.customdata[-len(path):]) == path


def test_accepted_path_is_drawn_first_and_on_top(paper_run):
    assert_path_first_and_on_top(big_step(paper_run[0]))


@settings(max_examples=40, deadline=None)
@given(records())
def test_random_tree_accepted_path_is_drawn_first_and_on_top(step):
    """Random q: the accepted child is often not its parent's most confident one."""
    assert_path_first_and_on_top(step)


def test_folding_counts_every_node_once_and_keeps_the_path(paper_run):
    step = big_step(paper_run[0])
    drawn, folded = fold_tree(step, max_siblings=3)
    assert set(tree_view.accepted_path(step)) <= drawn
    hidden = [i for nodes in folded.values() for i in nodes]
    assert len(hidden) == len(set(hidden)) and not drawn & set(hidden)
    assert len(drawn) + len(hidden) == len(step.tree)
    fig = tree_figure(step, fold=True, max_siblings=3)
    folds = next(t for t in fig.data if t.name == "folds")
    assert sorted(folds.customdata) == sorted(len(v) for v in folded.values())
    assert all(t == f"+{c} more" for t, c in zip(folds.text, folds.customdata))
    assert "showing" in fig.layout.annotations[0].text
    assert tree_figure(step).layout.height < tree_figure(step, fold=False).layout.height   # folded by default
    # a folded 60-node tree fits a page: root, path, bonus, 3 alternatives and a fold per level
    assert len(fig.data[0].x) > 0 and fig.layout.height <= tree_view.MARGIN["t"] + tree_view.MARGIN["b"] + 20 * (2 + 5 * (len(tree_view.accepted_path(step)) + 1))


def test_display_order_puts_ancestors_first_and_the_path_first(paper_run):
    step = big_step(paper_run[0])
    tree = step.tree
    order = display_order(tree.parents, tree.status, tree.confidence)
    assert sorted(order) == list(range(len(tree)))
    where = {n: j for j, n in enumerate(order)}
    assert all(where[p] < where[i] for i, p in enumerate(tree.parents) if p >= 0)
    assert order[:len(step.accepted)] == tree_view.accepted_path(step)


# --- the tree attention mask ------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(records())
def test_drawn_mask_is_the_engines_tree_attention_mask(step):
    """Cell (row a, column b) of the node block is lit iff the engine's own mask lets a attend
    to b; every row sees the whole context tail and the root. Lit cells among the root and
    node columns, over node rows: each node's ancestors, itself and the root, depth + 1."""
    tree = step.tree
    grid = mask_grid(tree, max_nodes=None)
    engine_mask = tree_attention_mask(tree.parents)              # (N+1, N+1) over [root, nodes]
    index = [0] + [n + 1 for n in grid.nodes]                     # drawn order -> engine rows
    expected = engine_mask[index][:, index]
    drawn = torch.tensor([row[TAIL_SLOTS:] for row in grid.allowed])
    assert torch.equal(drawn, expected)
    assert all(all(row[:TAIL_SLOTS]) for row in grid.allowed)
    assert lit_tree_cells(grid) == sum(d + 1 for d in tree.depths)
    assert sum(sum(row[TAIL_SLOTS:]) for row in grid.allowed) == sum(d + 1 for d in tree.depths) + 1   # + the root's row
    fig = mask_figure(step, max_nodes=None)
    assert [list(r) for r in fig.data[0].z] == grid.kind
    assert list(fig.data[0].meta["rows"]) == [-1] + grid.nodes


def test_mask_view_of_a_paper_tree(paper_run):
    step = big_step(paper_run[0])
    k = len(step.accepted)
    fig = mask_figure(step)                                      # folded: the first 24 nodes
    grid = mask_grid(step.tree)
    assert len(grid.nodes) == verify_view.MAX_NODES and grid.hidden == 60 - verify_view.MAX_NODES
    assert "+36 more" in fig.layout.annotations[-1].text
    drawn = set(grid.nodes)
    assert all(step.tree.parents[n] in drawn | {-1} for n in grid.nodes)   # no drawn node lacks its parent
    # the accepted path: rows 1..k, outlined, positions P+1..P+k in the row labels
    assert grid.nodes[:k] == tree_view.accepted_path(step)
    rect = next(s for s in fig.layout.shapes if s.type == "rect")
    assert (rect.y0, rect.y1) == (0.5, k + 0.5)
    labels = fig.layout.yaxis.ticktext
    assert all(f"pos P+{step.tree.depths[n]}" in labels[1 + j] for j, n in enumerate(grid.nodes))
    assert "pos 41" in mask_figure(step, prefix_len=40).layout.yaxis.ticktext[1]
    a, b = next((a, b) for a in grid.nodes for b in grid.nodes
                if a != b and step.tree.parents[a] == step.tree.parents[b])
    row, col = 1 + grid.nodes.index(a), TAIL_SLOTS + 1 + grid.nodes.index(b)
    assert grid.kind[row][col] == verify_view.MASKED and "sibling" in fig.data[0].text[row][col]


# --- the KV cache -----------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(records(max_nodes=20), st.integers(0, 6))
def test_kv_plan_is_what_the_engines_cache_keeps(step, prefix):
    """Fill a real cache (kv.preallocated_cache) with P context slots and the forward's
    1 + N slots, each key holding its own slot number; apply kv.keep_positions with the
    engine's offsets; the plan must say which slot landed where."""
    plan = kv_plan(step, prefix_len=prefix)
    n = len(step.tree)
    cache = kv.preallocated_cache(None, 4)
    slots = torch.arange(prefix + 1 + n, dtype=torch.float32).view(1, 1, -1, 1)     # (B, heads, S, d)
    cache.update(slots, slots.clone(), 0)
    engine_offsets = [0] + [i + 1 for i in range(n) if step.tree.status[i] == "accepted"]  # Engine.commit's `keep`
    kv.keep_positions(cache, prefix, engine_offsets)
    kept = cache.layers[0].keys[0, 0, :, 0].tolist()
    assert kv.cache_length(cache) == plan.length_after == prefix + 1 + len(step.accepted)
    assert kept == list(range(prefix)) + [prefix + o for o in plan.kept_from]
    assert plan.kept == 1 + len(step.accepted)
    assert plan.length_verified == prefix + 1 + n and plan.length_before == prefix


def test_kv_figure_keeps_root_and_path_and_drops_the_rest(paper_run, small_run):
    for step in (big_step(paper_run[0]), next(s for s in small_run[0][1:] if s.accepted)):
        fig = kv_figure(step)
        k, n = len(step.accepted), len(step.tree)
        trace = {t.name: t for t in fig.data}
        kept_verify = len(trace["root (verify)"].x) + len(trace["kept (verify)"].x)
        kept_after = len(trace["root (after)"].x) + len(trace["kept (after)"].x)
        assert kept_verify == kept_after == 1 + k
        dropped = trace.get("dropped (verify)")
        counts = list(dropped.customdata) if dropped is not None else []
        assert sum(counts) == n - k                              # every dropped slot drawn or counted
        assert list(trace["kept (after)"].x) == [TAIL_SLOTS + 1.0 + j for j in range(k)]   # contiguous
        arrows = [a for a in fig.layout.annotations if a.showarrow]
        assert len(arrows) == k
        assert fig.layout.yaxis.ticktext[1].endswith(f"+{n} nodes") and f"root + {k} kept" in fig.layout.yaxis.ticktext[2]
        assert f"{1 + n} slots written, {1 + k} kept" in fig.layout.title.text
    big = kv_figure(big_step(paper_run[0]))
    assert len(big.data) and max(c for t in big.data if t.name == "dropped (verify)" for c in t.customdata) > 1   # runs fold


def test_captions_name_the_step_numbers(paper_run):
    step = big_step(paper_run[0])
    k = len(step.accepted)
    assert "sibling" in verify_view.mask_caption() and "masked" in verify_view.mask_caption()
    assert f"{sum(d + 1 for d in step.tree.depths)} lit cells" in verify_view.mask_caption(step)
    assert "no memory afterwards" in verify_view.kv_caption()
    assert f"61 slots written, {1 + k} kept, {60 - k} dropped" in verify_view.kv_caption(step)
    assert "how sure the draft head was" in verify_view.tree_caption(step)


# --- A/B --------------------------------------------------------------------------------------

def test_ab_figure_reads_both_runs(paper_run, small_run):
    (a, sa), (b, sb) = small_run, paper_run
    fig = compare.ab_figure(a, sa, b, sb, labels=("small", "paper"), vanilla_tokens_per_s=50.0)
    go.Figure(fig.to_dict())
    depth_bars = [t for t in fig.data if t.xaxis == "x"]
    assert [t.name for t in depth_bars] == ["small", "paper"]
    assert list(depth_bars[0].y) == pytest.approx(acceptance_by_depth(a))
    assert list(depth_bars[1].y) == pytest.approx(acceptance_by_depth(b))
    tau = [t.y[0] for t in fig.data if t.xaxis == "x2"]
    tps = [t.y[0] for t in fig.data if t.xaxis == "x3"]
    assert tau == pytest.approx([sa.mean_accepted, sb.mean_accepted])
    assert tps == pytest.approx([sa.tokens_per_s, sb.tokens_per_s])
    vanilla = [s for s in fig.layout.shapes if s.yref == "y3"]
    assert len(vanilla) == 1 and vanilla[0].y0 == 50.0     # one vanilla for both: one line
    assert summarize("dynamic", a, sa.text).mean_accepted == pytest.approx(sa.mean_accepted)


def test_ab_trees_side_by_side_at_one_step(paper_run, small_run):
    a, b = small_run[0], paper_run[0]
    fig = compare.ab_trees_figure(a[2], b[2], labels=("small", "paper"))
    go.Figure(fig.to_dict())
    nodes = [t for t in fig.data if t.name == "nodes"]
    assert [(t.xaxis, t.yaxis) for t in nodes] == [("x", "y"), ("x2", "y2")]
    assert len(nodes[0].x) == len(a[2].tree)
    assert [t.marker.showscale for t in nodes] == [False, True]        # one shared colour bar
    assert fig.layout.xaxis.domain[1] < fig.layout.xaxis2.domain[0]
    assert "prefill" in compare.ab_trees_figure(a[0], b[2]).layout.annotations[0].text


def test_new_figures_are_valid_plotly(paper_run):
    step = big_step(paper_run[0])
    vanilla = StepEvent(step=0, method="vanilla", tree=None, accepted=[], bonus=7, new_tokens=[7], text="x")
    for fig in (tree_figure(step), tree_figure(step, fold=False), mask_figure(step), mask_figure(step, max_nodes=None),
                kv_figure(step), kv_figure(step, prefix_len=40), mask_figure(vanilla), kv_figure(None)):
        go.Figure(fig.to_dict())
