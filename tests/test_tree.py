"""Tree policies are pure functions: checked with synthetic draft scores (property-based)."""
from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings, strategies as st

from app.engine.config import TreeConfig
from app.engine.tree import (ROOT, DraftTree, finalize, grow_tree, proposals_needed, tree_attention_mask,
                             tree_mask_rows)


def synthetic_propose(seed: int, vocab: int = 50, peak: float = 3.0):
    """A deterministic fake draft: each (node path) gets its own random distribution."""
    calls = []

    def propose(tree: DraftTree, frontier, depth):
        probs, ids = [], []
        k = proposals_needed_holder[0]
        for node in frontier:
            key = (seed,) + (() if node == ROOT else tuple(tree.tokens[a] for a in tree.ancestors(node)) + (tree.tokens[node],))
            g = torch.Generator().manual_seed(hash(key) % (2**31))
            q = torch.softmax(torch.randn(vocab, generator=g) * peak, -1)
            top = torch.topk(q, k)
            probs.append(top.values.tolist())
            ids.append(top.indices.tolist())
        calls.append((list(frontier), depth))
        return probs, ids

    proposals_needed_holder = [1]
    return propose, calls, proposals_needed_holder


def build(cfg: TreeConfig, seed: int):
    propose, calls, holder = synthetic_propose(seed)
    holder[0] = proposals_needed(cfg)
    return grow_tree(cfg, propose), calls


configs = st.builds(
    TreeConfig,
    method=st.sampled_from(["dynamic", "static", "chain", "threshold"]),
    depth=st.integers(1, 6),
    top_k=st.integers(1, 6),
    total_tokens=st.integers(1, 40),
    tau_high=st.floats(0.3, 1.0),
    tau_low=st.floats(0.0, 0.3),
    min_confidence=st.sampled_from([0.0, 0.0, 0.01, 0.1, 0.5]),
)


@settings(max_examples=150, deadline=None)
@given(cfg=configs, seed=st.integers(0, 10_000))
def test_tree_invariants(cfg, seed):
    tree, calls = build(cfg, seed)
    n = len(tree)
    assert n <= cfg.total_tokens
    assert len(calls) <= cfg.depth
    for i, p in enumerate(tree.parents):
        assert p < i                                        # parents precede children
        assert tree.depths[i] == (1 if p == ROOT else tree.depths[p] + 1)
        assert 1 <= tree.depths[i] <= cfg.depth
        parent_conf = 1.0 if p == ROOT else tree.confidence[p]
        assert tree.confidence[i] == pytest.approx(parent_conf * tree.q[i])
        assert tree.confidence[i] >= cfg.min_confidence     # the cut is honoured
    # siblings carry distinct tokens (top-k of one distribution)
    for kids in tree.children():
        assert len({tree.tokens[c] for c in kids}) == len(kids)
    if cfg.method == "chain":
        assert tree.parents == list(range(-1, n - 1))
    if cfg.method == "threshold":
        for node, kids in zip([ROOT] + list(range(n)), tree.children()):
            conf = 1.0 if node == ROOT else tree.confidence[node]
            assert len(kids) <= (2 if conf > cfg.tau_high else 1 if conf > cfg.tau_low else 0)
    if cfg.method == "static":
        paths = {tree.path(i) for i in range(n)}
        assert paths <= set(cfg.static_shape)


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 5), top_k=st.integers(1, 5), total=st.integers(1, 60), seed=st.integers(0, 1000))
def test_dynamic_keeps_the_most_confident_candidates(depth, top_k, total, seed):
    """EAGLE-2: the final tree is the top-`total` of all candidates by confidence, and each
    level expands the top_k most confident new nodes."""
    cfg = TreeConfig(method="dynamic", depth=depth, top_k=top_k, total_tokens=total)
    tree, calls = build(cfg, seed)
    full, full_calls = build(TreeConfig(method="dynamic", depth=depth, top_k=top_k, total_tokens=256), seed)
    expected = sorted(full.confidence, reverse=True)[:total]
    assert sorted(tree.confidence, reverse=True) == pytest.approx(expected)
    for frontier, d in calls[1:]:
        assert len(frontier) <= top_k
    # growth skips only what the rerank could never keep: the very tree of the full expansion
    # (256 keeps every node of these sizes that can reach the top `total`), from fewer rows
    same = finalize(cfg, full)
    assert (tree.tokens, tree.parents, tree.ranks) == (same.tokens, same.parents, same.ranks)
    assert sum(len(f) for f, _ in calls) <= sum(len(f) for f, _ in full_calls)


def test_dynamic_growth_drafts_only_rows_that_can_reach_the_tree():
    """4/2/8: the root proposes 4 children (not 8) and the second level expands the 3 best of
    them (not 8): a fourth depth-1 node's child would rank behind 3 better depth-1 nodes and
    its own parent."""
    cfg = TreeConfig(method="dynamic", depth=2, top_k=8, total_tokens=4)
    tree, calls = build(cfg, 7)
    assert proposals_needed(cfg) == 4
    assert [len(f) for f, _ in calls] == [1, 3]
    full, _ = build(TreeConfig(method="dynamic", depth=2, top_k=8, total_tokens=80), 7)
    assert tree.tokens == finalize(cfg, full).tokens


def test_threshold_rule_by_hand():
    """Root (confidence 1) gets two children; a child with q=0.6 one; below tau_low none."""
    q_by_depth = {1: ([0.6, 0.3], [10, 11]), 2: ([0.5, 0.4], [20, 21])}

    def propose(tree, frontier, depth):
        vals, ids = q_by_depth.get(depth, ([0.5, 0.4], [30, 31]))
        return [vals] * len(frontier), [ids] * len(frontier)

    cfg = TreeConfig(method="threshold", depth=3, tau_high=0.7, tau_low=0.25, total_tokens=50)
    tree = grow_tree(cfg, propose)
    # root -> 10 (0.6), 11 (0.3); 10 (0.6 > 0.25, < 0.7) -> 20 (0.3); 11 (0.3) -> 20 (0.15)
    # 20 under 10 (0.3 > 0.25) -> 30 (0.15); 20 under 11 (0.15) -> nothing
    assert tree.tokens == [10, 11, 20, 20, 30]
    assert tree.parents == [-1, -1, 0, 1, 2]
    assert tree.confidence == pytest.approx([0.6, 0.3, 0.3, 0.15, 0.15])


def test_min_confidence_drops_subtrees():
    def propose(tree, frontier, depth):
        return [[0.9, 0.05]] * len(frontier), [[1, 2]] * len(frontier)

    tree = grow_tree(TreeConfig(method="dynamic", depth=3, top_k=2, total_tokens=50, min_confidence=0.04), propose)
    assert all(c >= 0.04 for c in tree.confidence)
    # level 3 expands the two most confident level-2 nodes (0.81 and the first 0.045)
    assert tree.confidence == pytest.approx([0.9, 0.05, 0.81, 0.045, 0.045, 0.729, 0.0405, 0.0405])
    assert 0.0025 not in [round(c, 6) for c in tree.confidence]


def brute_force_mask(parents):
    n = len(parents)
    m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    for i in range(n + 1):
        m[i, 0] = True
        node = i - 1
        while node != -1:
            m[i, node + 1] = True
            node = parents[node]
    return m


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=0, max_size=30))
def test_mask_is_exactly_the_ancestors(raw):
    parents = [(-1 if i == 0 else (r % (i + 1)) - 1) for i, r in enumerate(raw)]
    assert torch.equal(tree_attention_mask(parents), brute_force_mask(parents))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=0, max_size=20), st.integers(0, 40))
def test_the_kernels_row_mask_is_the_prefix_then_the_ancestors(raw, prefix):
    """``tree_mask_rows`` (the fast forward's (N+1, prefix+N+1) uint8 mask) is the bool mask the
    other forwards get: every row sees the prefix, then exactly its ancestors and itself."""
    parents = [(-1 if i == 0 else (r % (i + 1)) - 1) for i, r in enumerate(raw)]
    want = torch.cat([torch.ones(len(parents) + 1, prefix, dtype=torch.bool), brute_force_mask(parents)], 1)
    assert torch.equal(tree_mask_rows(parents, prefix), want.to(torch.uint8))


def test_static_shape_validation():
    with pytest.raises(ValueError, match="static_shape"):
        TreeConfig(method="static", static_shape=((0, 1),))       # path without its parent
    with pytest.raises(ValueError, match="static_shape"):
        TreeConfig(method="static", static_shape=((-1,),))
