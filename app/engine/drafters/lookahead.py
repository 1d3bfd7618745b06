"""Lookahead decoding (Fu et al., 2402.02057): n-grams from Jacobi iterations, no draft model.

Jacobi decoding guesses the next W tokens at once and refines all of them in parallel: one
forward over the guesses gives, at every position, the target's next-token prediction given
the guesses before it; those predictions are the next iteration's guesses. A guess that the
target confirms is accepted like any speculative token. Lookahead decoding adds a memory:
the n-grams that appear along these iterations go into a pool keyed by their first token,
and every step verifies the pool's n-grams that start with the current last token.

What this module implements (knobs: ``window`` W, ``ngram`` N, ``pool``, ``top_k`` G):

* The window: W guesses for the positions after the root, kept from step to step.
* Each step's tree = the window as one chain from the root, plus up to G pool n-grams that
  start with the root token (their N - 1 following tokens), merged into one trie of at most
  ``total_tokens`` nodes (the window first). The target verifies all of it in the engine's
  ONE tree-masked forward, so the Jacobi iteration costs no extra forward: the window's rows
  are extra rows of the verify forward.
* After the step (``observe``): the target's argmax at the root row and at every window row
  are this iteration's Jacobi outputs (the output at position X predicts X + 1). The next
  window is the outputs past the tokens just committed (input at X + 1 = output at X),
  padded to W with prompt tokens picked at random (as the paper initialises its window).
* N-grams follow the trajectories across iterations, by absolute position: the input at X
  in iteration t is the output at X - 1 of iteration t - 1, itself computed from the input
  at X - 1 there, and so on. Walking back N - 2 iterations from an output gives the n-gram
  (input_{t-N+2}(X-N+2), ..., input_t(X), output_t(X)), each token the target's prediction
  after the one before it; it enters the pool keyed by its first token (the newest last;
  beyond ``pool`` n-grams per key the oldest goes).
* Node ``q``: count-based, as for pld (``drafters.sequences.tree_from_sequences``).

How it differs from the paper: the paper feeds the last N - 1 iterations as a 2-D window
(W x (N - 1) tokens) in every forward, each token attending to the prefix and to its own
diagonal trajectory, so one forward advances W trajectories of length N at once. Here the
forward holds one level only, as a plain chain (each guess sees every guess before it, as
in textbook Jacobi decoding), and the earlier levels are remembered on the host, so each
trajectory's earlier tokens were computed in earlier steps. Every row of the forward thus
stays a node of a tree, verified by the same mask and rules as every other method, and the
Jacobi rows are candidates too (a window that has converged is accepted directly). The
paper's window also stays put while this one slides with the committed tokens, which it
has to: its positions are relative to the root. Under sampling the outputs are still
argmaxes: guesses only steer what is verified, never what is emitted.
"""
from __future__ import annotations

import random
from collections import OrderedDict, deque

from app.engine.drafters.sequences import tree_from_sequences
from app.engine.tree import DraftTree


class Lookahead:
    """The lookahead drafter's per-run state: the Jacobi window and the n-gram pool."""

    name = "lookahead"

    def __init__(self, cfg, prompt_ids: list[int]):
        self.prompt = list(prompt_ids)
        self.rng = random.Random(0)                       # window filler: replays exactly, draws nothing from the run's generator
        self.window = self._filler(cfg.window)            # guesses for the W positions after the root
        self.pool: dict[int, OrderedDict] = {}            # first token -> {(N-1 following tokens): None}, oldest first
        self.window_nodes: list[int] = []                 # this step: node of each window guess in the tree
        self.history: deque = deque(maxlen=max(1, cfg.ngram - 2))   # last iterations: {position: (input, output)}

    @classmethod
    def start(cls, engine, cfg, prompt_ids: list[int], features) -> "Lookahead":
        return cls(cfg, prompt_ids)

    def _filler(self, n: int) -> list[int]:
        return [self.rng.choice(self.prompt) for _ in range(n)]

    def candidates(self, root: int, g: int) -> list[list[int]]:
        """The ``g`` most recently collected n-grams that start with ``root`` (without it)."""
        grams = self.pool.get(root)
        return [list(c) for c in reversed(grams)][:g] if grams else []

    def draft(self, engine, run, cfg) -> DraftTree:
        root = run.tokens[-1]
        seqs = [self.window[: cfg.window]] + self.candidates(root, cfg.top_k)
        tree, nodes = tree_from_sequences(seqs, cfg.total_tokens)
        self.window_nodes = nodes[0]
        return tree

    def _remember(self, gram: list[int], cap: int) -> None:
        grams = self.pool.setdefault(gram[0], OrderedDict())
        cont = tuple(gram[1:])
        grams.pop(cont, None)
        grams[cont] = None                                # most recent last
        while len(grams) > cap:
            grams.popitem(last=False)

    def observe(self, engine, run, verified, tree, path, bonus, cfg) -> None:
        """One Jacobi iteration from the verify forward's rows: collect n-grams, slide the window."""
        rows = [0] + [node + 1 for node in self.window_nodes]          # root row, then each guess's row
        inputs = [verified.root] + self.window[: len(self.window_nodes)]
        outputs = [int(verified.logits[r].argmax()) for r in rows]       # at position X: predicts X + 1
        now = {verified.prefix + j: (inp, out) for j, (inp, out) in enumerate(zip(inputs, outputs))}
        for x, (inp, out) in now.items():
            gram, at = [inp, out], x
            for earlier in reversed(self.history):                       # walk the trajectory back
                step = earlier.get(at - 1)
                if step is None or step[1] != gram[0] or len(gram) == cfg.ngram:
                    break
                gram.insert(0, step[0])
                at -= 1
            if len(gram) == cfg.ngram:
                self._remember(gram, cfg.pool)
        self.history.append(now)
        advanced = len(path) + 1                          # the new root sits this many positions further
        kept = outputs[advanced:]                         # guesses for the positions after the new root
        self.window = (kept + self._filler(cfg.window))[: cfg.window]
