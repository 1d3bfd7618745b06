"""Candidate token sequences as one draft tree (a trie), for the drafters whose candidates are
fixed continuations rather than draws from a distribution (prompt lookup, lookahead)."""
from __future__ import annotations

from app.engine.tree import ROOT, DraftTree


def tree_from_sequences(seqs: list[list[int]], total_tokens: int) -> tuple[DraftTree, list[list[int]]]:
    """A trie of candidate continuations of the root, as a DraftTree in parent-first order.

    Sequences are inserted in priority order; shared prefixes share nodes, and a new node is
    only made while fewer than ``total_tokens`` exist (a later sequence may be cut short).
    Each node's ``q`` is count-based: the share of the sequences through its parent that go
    on with its token (1.0 where all agree), so ``confidence`` is the share of all sequences
    that reach the node. It scores agreement between candidates; it is not a probability any
    model assigned. Returns the tree and, per sequence, the node of each of its tokens that
    made it into the tree.
    """
    tokens: list[int] = []
    parents: list[int] = []
    counts: list[int] = []
    child: dict[tuple[int, int], int] = {}
    root_count = 0
    nodes_of: list[list[int]] = []
    for seq in seqs:
        at, path = ROOT, []
        for tok in seq:
            node = child.get((at, tok))
            if node is None:
                if len(tokens) >= total_tokens:
                    break
                node = child[(at, tok)] = len(tokens)
                tokens.append(int(tok))
                parents.append(at)
                counts.append(0)
            counts[node] += 1
            path.append(node)
            at = node
        root_count += bool(path)
        nodes_of.append(path)
    tree = DraftTree()
    rank: dict[int, int] = {}
    for i, (tok, par) in enumerate(zip(tokens, parents)):
        parent_count = root_count if par == ROOT else counts[par]
        rank[par] = rank.get(par, -1) + 1
        tree.add(par, tok, counts[i] / parent_count, rank[par])
    return tree, nodes_of
