"""Draft-tree policies as pure functions: draft scores in, tree out. No model code here.

A tree hangs from the *root*, the last committed token (not a node itself; index -1).
Node i has a token, a parent, a depth (1 = child of the root), its draft probability q given
the parent, and its *confidence*: the product of q along the path from the root — EAGLE-2's
estimate of the chance the whole path is accepted (2406.16858 shows it is well calibrated).

The tree grows level by level (``grow_tree``). At each level the caller's ``propose``
function runs the draft model on the frontier and returns each frontier node's best
children (probabilities and token ids, best first). The policy decides

    child_ranks(node)      which of those children enter the tree,
    select_frontier(new)   which new nodes are expanded at the next level, and
    finalize(tree)         which nodes survive to verification (size cap, confidence cut).

Policies:
    dynamic    EAGLE-2: every expanded node proposes its top_k children; the top_k new nodes
               by confidence are expanded next; at the end all candidates are reranked and the
               best total_tokens kept (connected: a child never outscores its parent). Growth
               skips what that rerank can never keep (``_useful``): the same tree, fewer rows.
    static     EAGLE-1: a fixed shape of child ranks, the same every step.
    chain      one child per level: classic speculative decoding with this head as drafter.
    threshold  confidence > tau_high: 2 children; > tau_low: 1 child; else none.
All policies then drop nodes below min_confidence and keep at most total_tokens nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from app.engine.config import TreeConfig

ROOT = -1


@dataclass
class DraftTree:
    """A draft tree in parent-first order (a parent's index is smaller than its children's)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    q: list[float] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)   # rank of the node among its parent's proposals
    sources: list[str | None] = field(default_factory=list)   # who proposed it: None = the step's drafter,
                                                              # "pld" = a prompt-lookup branch (merge_branch)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, q: float, rank: int, source: str | None = None) -> int:
        parent_conf = 1.0 if parent == ROOT else self.confidence[parent]
        parent_depth = 0 if parent == ROOT else self.depths[parent]
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.depths.append(parent_depth + 1)
        self.q.append(float(q))
        self.confidence.append(parent_conf * float(q))
        self.ranks.append(int(rank))
        self.sources.append(source)
        return len(self.tokens) - 1

    def path(self, node: int) -> tuple[int, ...]:
        """Child ranks from the root down to ``node`` (the static policy's address)."""
        out = []
        while node != ROOT:
            out.append(self.ranks[node])
            node = self.parents[node]
        return tuple(reversed(out))

    def ancestors(self, node: int) -> list[int]:
        """Ancestors of ``node`` from the root's child down to its parent."""
        out = []
        node = self.parents[node]
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def children(self) -> list[list[int]]:
        """children()[i + 1] lists node i's children in order; children()[0] the root's."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i)
        return kids

    def subtree(self, keep: Sequence[int]) -> "DraftTree":
        """The tree restricted to ``keep`` (which must contain every kept node's parent)."""
        keep = sorted(keep)
        new_index = {old: new for new, old in enumerate(keep)}
        out = DraftTree()
        for old in keep:
            p = self.parents[old]
            if p != ROOT and p not in new_index:
                raise ValueError(f"node {old} kept without its parent {p}")
            out.tokens.append(self.tokens[old])
            out.parents.append(ROOT if p == ROOT else new_index[p])
            out.depths.append(self.depths[old])
            out.q.append(self.q[old])
            out.confidence.append(self.confidence[old])
            out.ranks.append(self.ranks[old])
            out.sources.append(self.sources[old])
        return out

    def _shared_path(self, tokens: Sequence[int]) -> list[int]:
        """The nodes of the longest path from the root that spells a prefix of ``tokens``."""
        child = {(p, t): i for i, (p, t) in enumerate(zip(self.parents, self.tokens))}
        at, shared = ROOT, []
        for tok in tokens:
            at = child.get((at, int(tok)))
            if at is None:
                break
            shared.append(at)
        return shared

    def make_room_for(self, tokens: Sequence[int], max_nodes: int) -> "DraftTree":
        """This tree, cut so that the branch ``tokens`` (see ``merge_branch``) fits in
        ``max_nodes`` nodes beside it: the nodes the branch shares stay, then the most
        confident others (``finalize``'s order, which keeps the tree connected) while room
        is left. Returns self when the branch fits as it is."""
        shared = self._shared_path(tokens)
        new = min(len(tokens) - len(shared), max(0, max_nodes - len(shared)))
        if len(self) + new <= max_nodes:
            return self
        keep = set(shared)
        for n in sorted(range(len(self)), key=lambda n: (-self.confidence[n], n)):
            if len(keep) >= max_nodes - new:
                break
            keep.add(n)   # a node's parent comes before it in this order, so the kept nodes stay a tree
        return self.subtree(sorted(keep))

    def merge_branch(self, tokens: Sequence[int], source: str, max_nodes: int) -> list[int]:
        """Hang the continuation ``tokens`` from the root as one more branch, sharing the nodes
        it already has: where its first j tokens are a path of the tree, it goes on from there.
        Its new nodes get q = 1 (a proposal no model scored; ``source`` says who made it) and
        rank -1; nothing is added past ``max_nodes`` nodes. Returns the branch's nodes, old
        and new. New nodes come after every existing one, so parents still come first."""
        out = self._shared_path(tokens)
        at = out[-1] if out else ROOT
        for tok in tokens[len(out):]:
            if len(self) >= max_nodes:
                break
            at = self.add(at, tok, 1.0, -1, source)   # a new node has no children yet: the rest is new too
            out.append(at)
        return out


# --- the policy -------------------------------------------------------------------------------

def _useful(cfg: TreeConfig, depth: int) -> int:
    """dynamic: how many children of a node at ``depth`` (the root is depth 0), and how many
    of the best new nodes at ``depth``, can still matter to the final tree.

    ``finalize`` reranks every node by (-confidence, index) and keeps N = total_tokens. A node
    comes after its non-root ancestors (never more confident, added earlier) and after its
    better-ranked siblings. So a node at depth d has d nodes before each of its children (its
    path), and its rank-r child r more: only r <= N - 1 - d can be kept. And the rank-j new
    node at depth d (j from 0) has the j better ones of its level before its children too, so
    only j <= N - 1 - d is worth expanding. Growing just these gives exactly the tree that
    EAGLE-2's full expansion keeps (the kept nodes are added in the same relative order),
    from fewer draft rows: at 4/2/8 the second level drafts 3 rows instead of 8."""
    return max(0, min(cfg.top_k, cfg.total_tokens - depth))


def proposals_needed(cfg: TreeConfig) -> int:
    """How many best children ``propose`` must return per frontier node."""
    if cfg.method == "dynamic":
        return _useful(cfg, 0)                 # the root's children, the most any node needs
    if cfg.method == "static":
        return 1 + max(r for path in cfg.static_shape for r in path)
    if cfg.method == "threshold":
        return 2
    return 1  # chain


def child_ranks(cfg: TreeConfig, tree: DraftTree, node: int) -> list[int]:
    """Ranks (0 = best) of the proposed children of ``node`` that enter the tree."""
    if cfg.method == "dynamic":
        return list(range(_useful(cfg, 0 if node == ROOT else tree.depths[node])))
    if cfg.method == "static":
        base = () if node == ROOT else tree.path(node)
        return sorted({p[-1] for p in cfg.static_shape if len(p) == len(base) + 1 and p[:-1] == base})
    if cfg.method == "threshold":
        conf = 1.0 if node == ROOT else tree.confidence[node]
        return [0, 1] if conf > cfg.tau_high else [0] if conf > cfg.tau_low else []
    return [0]  # chain


def select_frontier(cfg: TreeConfig, tree: DraftTree, new_nodes: list[int]) -> list[int]:
    """Which of the nodes added at this level are expanded at the next one."""
    alive = [n for n in new_nodes if tree.confidence[n] >= cfg.min_confidence]
    if cfg.method == "dynamic":
        # EAGLE-2: the top_k most confident new nodes (of those that can matter); ties go to
        # the earlier node.
        alive.sort(key=lambda n: (-tree.confidence[n], n))
        return sorted(alive[: _useful(cfg, tree.depths[alive[0]])] if alive else [])
    if cfg.method == "static":
        return [n for n in alive if child_ranks(cfg, tree, n)]
    if cfg.method == "threshold":
        return [n for n in alive if tree.confidence[n] > cfg.tau_low]
    return alive  # chain: the single new node


def finalize(cfg: TreeConfig, tree: DraftTree) -> DraftTree:
    """Drop nodes below min_confidence, keep the best total_tokens, parents first.

    Sorting by (-confidence, index) keeps the tree connected: a child's confidence is its
    parent's times q <= 1, so never larger, and on a tie the parent's smaller index wins.
    """
    candidates = [n for n in range(len(tree)) if tree.confidence[n] >= cfg.min_confidence]
    candidates.sort(key=lambda n: (-tree.confidence[n], n))
    return tree.subtree(candidates[: cfg.total_tokens])


# probs[b][r], ids[b][r]: the r-th best proposed child of frontier node b.
ProposeFn = Callable[[DraftTree, list[int], int], tuple[list[list[float]], list[list[int]]]]


def grow_tree(cfg: TreeConfig, propose: ProposeFn) -> DraftTree:
    """Grow a draft tree for one step.

    ``propose(tree, frontier, depth)`` is called once per level with the tree so far and the
    frontier's node indices (``[ROOT]`` at depth 1) and must return, for each frontier node,
    its ``proposals_needed(cfg)`` best children. It is the only place a model runs;
    everything else here is bookkeeping.
    """
    tree = DraftTree()
    frontier = [ROOT]
    for depth in range(1, cfg.depth + 1):
        probs, ids = propose(tree, frontier, depth)
        new_nodes = []
        for b, node in enumerate(frontier):
            for r in child_ranks(cfg, tree, node):
                if r < len(ids[b]):
                    new_nodes.append(tree.add(node, ids[b][r], probs[b][r], r))
        if depth == cfg.depth:
            break
        frontier = select_frontier(cfg, tree, new_nodes)
        if not frontier:
            break
    return finalize(cfg, tree)


# --- tree attention -------------------------------------------------------------------------

def tree_attention_mask(parents: Sequence[int], device=None) -> torch.Tensor:
    """(N+1, N+1) bool mask over [root, node 0, ..., node N-1]: row i may attend to column j
    iff j is i itself or one of its ancestors (the root is everyone's ancestor)."""
    n = len(parents)
    # rows as Python lists, one tensor at the end: two tensor assignments per row cost
    # 0.15 ms for an 11-node tree every verify step, this 0.03 ms
    rows = [[True] + [False] * n]                           # the root sees itself
    for i, p in enumerate(parents):  # parents first, so row p+1 is complete when row i+1 copies it
        row = rows[p + 1].copy()
        row[i + 1] = True
        rows.append(row)
    mask = torch.tensor(rows, dtype=torch.bool, device="cpu")   # built on the host, moved once
    return mask.to(device) if device is not None else mask


def mask_rows(visible: Sequence[Sequence[int]], prefix: int, width: int) -> torch.Tensor:
    """(len(visible), width) uint8, the masks the fast kernels read (1 = visible): row r sees
    positions [0, prefix) and ``visible[r]``. Built as bytes and wrapped once: on a CPU whose
    caches a forward has just streamed its weights through, each tensor operation costs
    several microseconds, and a bool mask's ones, concatenation, assignments and conversion
    took four or more (the verify forward's and the head's in-step masks)."""
    rows = bytearray(len(visible) * width)
    for r, seen in enumerate(visible):
        rows[r * width:r * width + prefix] = b"\x01" * prefix
        for j in seen:
            rows[r * width + j] = 1
    return torch.frombuffer(rows, dtype=torch.uint8).view(len(visible), width)


def tree_mask_rows(parents: Sequence[int], prefix: int) -> torch.Tensor:
    """The verify forward's whole mask as the fast kernels read it: (N+1, prefix+N+1) uint8
    over [the prefix's cached positions, root, node 0, ..., node N-1]: every row sees the
    prefix, and its part over [root, nodes] is ``tree_attention_mask``'s."""
    seen = [[prefix]]                                        # the root sees itself
    for i, p in enumerate(parents):    # parents first, so row p+1 is complete when row i+1 extends it
        seen.append(seen[p + 1] + [prefix + i + 1])
    return mask_rows(seen, prefix, prefix + len(parents) + 1)
