"""Where each node of a step's draft tree goes: which nodes are drawn, in which rows and columns.

The tree figure (``tree.py``) is an *outline*, like a file browser. Every drawn node has its
own row (a depth-first walk, the accepted path first: ``display_order``) and sits in the
column of its depth (root = column 0). Each label sits to the right of its node, on that
node's row, and nothing else is ever drawn on a row to the right of its node, so labels cannot
collide and no edge can strike one through: an edge leaves its parent straight down (at the
parent's x, left of every label below it) and turns right into the child on the child's own row.

Big trees are folded around the accepted path (``fold_tree``): the path, the best
``max_siblings`` alternatives at each of its levels, and one "+N more" row per path node that
counts everything else hanging there.

This module is the geometry only (rows, parents, columns, folds: ``TreeLayout``), with no
plotly, so the mask view (``verify_view.py``) and the tests share the same node order without
drawing; ``tree.py`` turns a layout into traces.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from app.engine.events import StepEvent

ROOT_ID = "root"
BONUS_ID = "bonus"
MAX_SIBLINGS = 4        # folded: alternatives shown per accepted-path level


def _children(parents: list[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {-1: []}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
        kids.setdefault(i, [])
    return kids


def _descendants(kids: dict[int, list[int]], node: int) -> list[int]:
    out, stack = [], list(kids[node])
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(kids[n])
    return out


def accepted_path(step: StepEvent) -> list[int]:
    """The accepted node indices from the root down."""
    tree = step.tree
    return sorted((i for i, s in enumerate(tree.status) if s == "accepted"), key=lambda i: tree.depths[i])


def _ordered(kids: list[int], status: list[str], confidence: list[float]) -> list[int]:
    """Children in drawing order: the accepted one first, then by confidence (best first)."""
    return sorted(kids, key=lambda c: (status[c] != "accepted", -confidence[c], c))


def display_order(parents: list[int], status: list[str], confidence: list[float]) -> list[int]:
    """All node indices in depth-first order, the accepted child first at every level, then
    siblings by confidence. Ancestors always come before their descendants, and the accepted
    path takes the first places: the order of the outline's rows and of the mask view."""
    kids = _children(parents)
    out: list[int] = []
    stack = list(reversed(_ordered(kids[-1], status, confidence)))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(_ordered(kids[node], status, confidence)))
    return out


def fold_tree(step: StepEvent, max_siblings: int = MAX_SIBLINGS) -> tuple[set[int], dict[int, list[int]]]:
    """Fold a tree around its accepted path: (drawn nodes, {path node or -1: folded nodes}).

    Drawn: the accepted path, and at each path node (and the root) its best ``max_siblings``
    other children. Every other node is counted in exactly one fold: that of the nearest
    path node above it. So drawn + folded is every node, once."""
    tree = step.tree
    kids = _children(tree.parents)
    path = accepted_path(step)
    drawn = set(path)
    folded: dict[int, list[int]] = {}
    for spine in [-1] + path:
        others = [c for c in _ordered(kids[spine], tree.status, tree.confidence) if tree.status[c] != "accepted"]
        shown = others[:max_siblings]
        drawn.update(shown)
        hidden = []
        for c in others:
            hidden += ([] if c in shown else [c]) + _descendants(kids, c)
        if hidden:
            folded[spine] = sorted(hidden)
    return drawn, folded


@dataclass
class TreeLayout:
    """Rows of the outline. Keys: draft node index, ``ROOT_ID``, ``BONUS_ID`` or ("fold", parent)."""

    rows: list = field(default_factory=list)          # keys, top to bottom
    parent: dict = field(default_factory=dict)        # key -> parent key
    column: dict = field(default_factory=dict)        # key -> depth column
    folded: dict = field(default_factory=dict)        # path node (-1 = root) -> folded node indices

    def xy(self, key) -> tuple[float, float]:
        return float(self.column[key]), -float(self.rows.index(key))


def tree_layout(step: StepEvent, bonus_parent: int | None, fold: bool,
                max_siblings: int = MAX_SIBLINGS) -> TreeLayout:
    """The outline's rows: a depth-first walk of a networkx ``DiGraph`` whose children are
    added in drawing order (bonus, accepted child, siblings by confidence, the fold node)."""
    tree = step.tree
    if fold:
        drawn, folded = fold_tree(step, max_siblings)
    else:
        drawn, folded = set(range(len(tree))), {}
    kids = _children(tree.parents)
    key = lambda i: ROOT_ID if i < 0 else i   # noqa: E731
    g = nx.DiGraph()
    g.add_node(ROOT_ID)
    out = TreeLayout(folded=folded)
    out.column[ROOT_ID] = 0
    for node in [-1] + display_order(tree.parents, tree.status, tree.confidence):
        if node >= 0 and node not in drawn:
            continue
        depth = 0 if node < 0 else tree.depths[node]
        if bonus_parent == node:
            g.add_edge(key(node), BONUS_ID)
            out.parent[BONUS_ID], out.column[BONUS_ID] = key(node), depth + 1
        for c in _ordered(kids[node], tree.status, tree.confidence):
            if c in drawn:
                g.add_edge(key(node), c)
                out.parent[c], out.column[c] = key(node), depth + 1
        if node in folded:
            g.add_edge(key(node), ("fold", node))
            out.parent[("fold", node)], out.column[("fold", node)] = key(node), depth + 1
    out.rows = list(nx.dfs_preorder_nodes(g, ROOT_ID))
    return out
