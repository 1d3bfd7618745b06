"""Drafters other than the EAGLE head, as the EAGLE papers compare them, in the one engine.

Each drafter turns what a run knows into a ``DraftTree``; the engine verifies it with the
same tree-masked target forward and the same acceptance rules as EAGLE's trees
(``Engine.verify`` / ``Engine.accept``), so every method is lossless the same way:

    pld        prompt lookup: continuations of earlier occurrences of the context's last
               n-gram (no model at all)                                    -> pld.py
    lookahead  n-grams collected from Jacobi iterations on a window of guesses, which ride in
               the verify forward as one extra branch (no trained weights)  -> lookahead.py
    medusa     k extra heads on the target's last hidden state, one per future offset, and a
               static tree over their top-k (trained heads)                 -> medusa.py

Candidates of pld and lookahead are fixed token sequences, not draws from a distribution,
so under sampling ``verify.sequential_verify`` (the multi-candidate rule for deterministic
children) keeps the output distributed exactly as the target's. Their nodes' ``q`` is a
count, not a probability (``tree_from_sequences``).

A drafter object lives in the run (``_Run.drafter``), never on a model: ``start`` makes one
from the prefill, ``draft`` proposes a step's tree, ``observe`` reads the verify forward
after the step is committed.
"""
from __future__ import annotations

from app.engine.tree import ROOT, DraftTree

NAMES = ("pld", "lookahead", "medusa")


def start(engine, cfg, prompt_ids: list[int], features):
    """The run's drafter for ``cfg.method``, or None for the EAGLE head's methods and vanilla.
    ``features``: (1, m, H) the target's last hidden states over the prompt."""
    if cfg.method == "pld":
        from app.engine.drafters.pld import PromptLookup

        return PromptLookup()
    if cfg.method == "lookahead":
        from app.engine.drafters.lookahead import Lookahead

        return Lookahead(cfg, prompt_ids)
    if cfg.method == "medusa":
        from app.engine.drafters.medusa import MedusaDrafter

        return MedusaDrafter(features[0, -1])
    return None


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
