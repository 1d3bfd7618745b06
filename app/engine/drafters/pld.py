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
