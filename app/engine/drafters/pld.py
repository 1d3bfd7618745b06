"""Prompt lookup decoding (PLD): draft by copying from the context itself.

In answers that quote, summarise, edit code or repeat a pattern, the next tokens often
already appeared in the prompt or the answer so far. PLD takes the context's last n tokens
(the n-gram), finds earlier places where the same n tokens occur, and proposes what followed
them there. No model runs: drafting is string matching.

This is the idea behind transformers' ``generate(prompt_lookup_num_tokens=...)`` (the
``hf-pld`` benchmark row), which proposes ONE continuation, taken from the first match. Here:

* n goes from ``TreeConfig.ngram`` down to 1; the longest n with any match is used;
* the ``top_k`` most recent matches each propose a continuation of up to ``depth`` tokens;
* the continuations become one tree (a trie: shared prefixes share nodes), at most
  ``total_tokens`` nodes, so several different continuations are verified in one forward.

Node ``q`` = the share of the matches through the parent that continue with this token
(``drafters.sequences.tree_from_sequences``): 1.0 when every match agrees.

The same idea also runs beside the EAGLE head (``TreeConfig.lookup``): ``with_lookup_branch``
hangs one copied continuation on the head's tree, found through ``NgramIndex``.
"""
from __future__ import annotations

from app.engine.drafters.sequences import tree_from_sequences
from app.engine.tree import DraftTree


def lookup(tokens: list[int], max_ngram: int, length: int, max_matches: int) -> list[list[int]]:
    """Continuations (up to ``length`` tokens) of the ``max_matches`` most recent earlier
    occurrences of the context's last n-gram, for the longest n <= ``max_ngram`` that occurs."""
    m = len(tokens)
    for n in range(min(max_ngram, m - 1), 0, -1):
        suffix = tokens[m - n:]
        last = suffix[-1]
        out: list[list[int]] = []
        # start i = m - n would be the suffix itself; i + n < m leaves at least one token after the match
        for i in range(m - n - 1, -1, -1):
            if tokens[i + n - 1] == last and tokens[i:i + n] == suffix:
                out.append(tokens[i + n:i + n + length])
                if len(out) == max_matches:
                    break
        if out:
            return out
    return []


class NgramIndex:
    """Where each n-gram of a growing token list last occurred with a token after it, for
    ``sizes`` n (e.g. 3 and 2), kept up to date in O(1) per appended token: prompt lookup
    beside the EAGLE head, whose every step asks one question ("what followed the context's
    last n tokens the last time they occurred?") of a context of thousands of tokens.

    ``lookup`` answers like ``lookup(tokens, max(sizes), length, 1)`` above restricted to
    n in ``sizes``: the longest n that occurred before, its most recent occurrence. Only
    n-grams that have a token after them are indexed, so the context's own last n-gram never
    matches itself. The index reads only ``tokens``, which must only grow (the engine's
    committed tokens)."""

    def __init__(self, sizes: tuple[int, ...] = (3, 2)):
        if not sizes or min(sizes) < 1:
            raise ValueError(f"sizes must be positive n-gram lengths, got {sizes!r}")
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        self.last: dict[tuple[int, ...], int] = {}   # n-gram -> the position right after its latest occurrence
        self.seen = 0                                # tokens[:seen] are indexed

    def update(self, tokens: list[int]) -> None:
        """Index the n-grams that ``tokens[seen:]`` gave a next token."""
        for end in range(max(self.seen, 1), len(tokens)):   # tokens[end] follows the n-grams ending at end - 1
            for n in self.sizes:
                if end >= n:
                    self.last[tuple(tokens[end - n:end])] = end
        self.seen = len(tokens)

    def lookup(self, tokens: list[int], length: int) -> list[int]:
        """Up to ``length`` tokens that followed the latest earlier occurrence of the context's
        last n-gram, for the longest n in ``sizes`` that occurred; [] if none did."""
        self.update(tokens)
        for n in self.sizes:
            if len(tokens) > n:
                start = self.last.get(tuple(tokens[-n:]))
                if start is not None:
                    return tokens[start:start + length]
        return []


class PromptLookup:
    """The pld drafter. It keeps no state: the run's committed tokens are all it reads."""

    name = "pld"

    @classmethod
    def start(cls, engine, cfg, prompt_ids: list[int], features) -> "PromptLookup":
        return cls()

    def draft(self, engine, run, cfg) -> DraftTree:
        seqs = lookup(run.tokens, cfg.ngram, cfg.depth, cfg.top_k)
        tree, _ = tree_from_sequences(seqs, cfg.total_tokens)
        return tree

    def observe(self, engine, run, verified, tree, path, bonus, cfg) -> None:
        pass


def with_lookup_branch(tree: DraftTree, run, cfg, free_rows: int | None) -> DraftTree:
    """Prompt lookup beside the EAGLE head (``TreeConfig.lookup``): hang what followed the
    context's last 3 (else 2) tokens where they last occurred as one more branch, so a
    summary, a quotation or code that repeats its own names is verified many tokens at
    a time even where the head is unsure. The head's nodes are untouched; the branch
    follows them as far as they agree and adds its own nodes after. Not for a sampled
    chain, whose rule needs every node drawn from q: every other tree's candidates are
    fixed, and the rules that verify them are exact for any fixed candidates.

    How many nodes the branch may add follows the verify forward's cost: on the fast
    kernels a forward costs about the same for every row count within one register
    block (``rowwise.c``'s MB: 8 rows with AVX-512, 4 with AVX2), so the branch fills the
    block's rows left free by the head's tree, and beyond them takes the places of the
    head's least confident nodes (``DraftTree.make_room_for``). On the eager forward
    (a GPU's, where rows are nearly free) it adds up to ``lookup`` nodes. Measured over
    the six suites: under AVX2 emulation 2/1/2 with the branch ran 1.31x our vanilla with
    its nodes in place of the head's and 1.25x added on top; natively, adding them to
    3/2/2 ran 1.78x against 1.69x in place (benchmarks/fast-forward/lookup-branch.md).

    ``run``: the generation's ``_Run`` (its committed tokens, and its ``NgramIndex``, made here on
    the first call); ``free_rows``: the rows beyond which a verify forward costs more
    (``Engine.free_rows``), None where rows are not counted."""
    if run.lookup is None:
        run.lookup = NgramIndex((3, 2))
    branch = run.lookup.lookup(run.tokens, cfg.lookup)
    if not branch:
        return tree
    limit = cfg.max_nodes
    if free_rows is not None:          # the rows beyond the root that one register block holds
        limit = max(cfg.total_tokens, min(limit, free_rows - 1))
    tree = tree.make_room_for(branch, limit)
    tree.merge_branch(branch, PromptLookup.name, limit)
    return tree
