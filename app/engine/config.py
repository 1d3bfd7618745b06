"""Settings for one generation, validated at the boundary.

Every bad value raises ``ValueError`` naming the parameter and its allowed range, so the CLI
can print it (exit 2) and the UI can show it as a message. Nothing downstream re-checks.

Two different "top-k"s exist in speculative decoding, so they get two different names here:
``TreeConfig.top_k`` is the EAGLE-2 branching factor of the draft tree, and
``SamplingConfig.top_k_sampling`` truncates the *target's* sampling distribution.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

METHODS = ("vanilla", "dynamic", "static", "chain", "threshold", "pld", "lookahead", "medusa")
# Who proposes the nodes: the EAGLE head grows the tree for these four policies; the other
# drafters (app/engine/drafters/) need no EAGLE head: prompt lookup and lookahead need no
# trained weights at all, Medusa has its own heads.
HEAD_METHODS = ("dynamic", "static", "chain", "threshold")
DRAFTER_METHODS = ("pld", "lookahead", "medusa")
MAX_POOL = 1024

# Upper bounds: generous for a GPU, but small enough that a stray API call cannot ask for a
# tree or an answer that takes the server down.
MAX_DEPTH = 16
MAX_TOP_K = 32
MAX_TOTAL_TOKENS = 256
MAX_NEW_TOKENS = 4096
MAX_TOP_K_SAMPLING = 100_000
MAX_SEED = 2**63 - 1

# EAGLE-1's static tree is given as paths of child ranks from the root: (0,) is the draft's
# best child of the root, (0, 1) that node's second-best child, and so on. This default is a
# 20-node shape (depth 5) that spends most nodes on the top-ranked branch, in the spirit of
# the EAGLE-1 paper's tree; override it with TreeConfig(static_shape=...).
DEFAULT_STATIC_SHAPE: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
    (0, 0, 0, 1, 0),
)


def _check_int(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


def _check_float(name: str, value, lo: float, hi: float, lo_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        left = "(" if lo_open else "["
        raise ValueError(f"{name} must be a number in {left}{lo}, {hi}], got {value!r}")


@dataclass(frozen=True)
class TreeConfig:
    """How the draft tree is grown each step.

    method:          vanilla (no draft) | dynamic (EAGLE-2) | static (EAGLE-1) | chain | threshold
                     | pld (prompt lookup) | lookahead (Jacobi n-grams) | medusa (Medusa heads)
    depth:           deepest level of drafted nodes (= draft forwards per step); pld: longest
                     continuation proposed; medusa: heads used (at most the heads loaded)
    top_k:           EAGLE-2 branching: nodes expanded per level, children proposed per node
    total_tokens:    at most this many draft nodes are verified (all tree methods)
    tau_high/low:    threshold method: a node with confidence > tau_high gets 2 children,
                     > tau_low 1 child, otherwise none
    min_confidence:  any method: drop nodes whose cumulative confidence is below this
    static_shape:    static and medusa: the tree as paths of child ranks (see DEFAULT_STATIC_SHAPE)
    ngram:           pld: longest n-gram of the context's end looked up (then shorter ones);
                     lookahead: N, the size of the n-grams collected (N - 1 tokens proposed)
    window:          lookahead: W, Jacobi guesses carried from step to step
    pool:            lookahead: n-grams kept per first token (the oldest are dropped)
    pld and lookahead put top_k candidate continuations in the tree (lookahead: top_k
    n-grams from the pool beside its window), at most total_tokens nodes in all.
    """

    method: str = "dynamic"
    depth: int = 5
    top_k: int = 8
    total_tokens: int = 24
    tau_high: float = 0.5
    tau_low: float = 0.05
    min_confidence: float = 0.0
    static_shape: tuple[tuple[int, ...], ...] = DEFAULT_STATIC_SHAPE
    ngram: int = 3
    window: int = 4
    pool: int = 8

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        _check_int("depth", self.depth, 1, MAX_DEPTH)
        _check_int("top_k", self.top_k, 1, MAX_TOP_K)
        _check_int("total_tokens", self.total_tokens, 1, MAX_TOTAL_TOKENS)
        _check_float("tau_low", self.tau_low, 0.0, 1.0)
        _check_float("tau_high", self.tau_high, 0.0, 1.0)
        if self.tau_low > self.tau_high:
            raise ValueError(
                f"tau_low must be <= tau_high (0 <= tau_low <= tau_high <= 1), "
                f"got tau_low={self.tau_low}, tau_high={self.tau_high}")
        _check_float("min_confidence", self.min_confidence, 0.0, 1.0)
        _check_int("ngram", self.ngram, 2 if self.method == "lookahead" else 1, MAX_DEPTH)
        _check_int("window", self.window, 1, MAX_DEPTH)
        _check_int("pool", self.pool, 1, MAX_POOL)
        shape = tuple(tuple(p) for p in self.static_shape)
        object.__setattr__(self, "static_shape", shape)
        if not shape or len(shape) > MAX_TOTAL_TOKENS:
            raise ValueError(f"static_shape must hold 1 to {MAX_TOTAL_TOKENS} paths")
        paths = set(shape)
        for path in shape:
            if not path or len(path) > MAX_DEPTH or any(
                    isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < MAX_TOP_K for r in path):
                raise ValueError(
                    f"static_shape paths must be 1..{MAX_DEPTH} child ranks in [0, {MAX_TOP_K}), got {path!r}")
            if len(path) > 1 and path[:-1] not in paths:
                raise ValueError(f"static_shape path {path!r} has no parent path {path[:-1]!r}")

    def shape(self) -> dict:
        """The knobs that shaped this tree, for the step records (``StepEvent.tree_config``)."""
        out = {"method": self.method, "depth": self.depth, "top_k": self.top_k, "total_tokens": self.total_tokens}
        if self.method == "threshold":
            out.update(tau_high=self.tau_high, tau_low=self.tau_low)
        if self.min_confidence > 0:
            out["min_confidence"] = self.min_confidence
        if self.method in ("pld", "lookahead"):
            # their nodes' q is the share of candidates through the parent that continue with the
            # node's token (app/engine/drafters.tree_from_sequences), not a model's probability
            out.update(ngram=self.ngram, q="count")
        if self.method == "lookahead":
            out.update(window=self.window, pool=self.pool)
        return out

    @property
    def uses_draft(self) -> bool:
        return self.method != "vanilla"

    @property
    def uses_head(self) -> bool:
        """Whether the EAGLE head drafts (the other drafters need none)."""
        return self.method in HEAD_METHODS

    @property
    def max_path(self) -> int:
        """The most draft tokens one step can accept (a step writes them past the answer)."""
        if not self.uses_draft:
            return 0
        if self.method == "lookahead":
            return min(self.total_tokens, max(self.window, self.ngram - 1))
        return self.depth

    @property
    def one_wide(self) -> bool:
        """A tree that is a chain: one child per level (method chain, or dynamic with top_k 1)."""
        return self.method == "chain" or (self.method == "dynamic" and self.top_k == 1)

    def samples_drafts(self, sampling: "SamplingConfig") -> bool:
        """Whether this step's drafts are *sampled* from q and verified by speculative sampling
        (``verify.chain_verify``: accept x with probability min(1, p(x)/q(x))) instead of taken
        as q's top-k and verified as fixed candidates (``verify.sequential_verify``).

        Only a chain can be, and under sampling a chain should be: a sampled draft is accepted
        with probability sum_x min(p(x), q(x)), a fixed top-1 draft with p(argmax q) only.
        With the shipped head at temperature 1.0 (mt_bench, two prompts), depth-1 acceptance is 0.46
        sampled against 0.19 fixed. Both rules are lossless; greedy decoding drafts q's
        argmax either way."""
        return self.one_wide and not sampling.greedy


@dataclass(frozen=True)
class SamplingConfig:
    """How the target's next token is chosen. temperature 0 = greedy.

    top_p and top_k_sampling shape the target distribution p (and, for sampled chains, the
    draft distribution q the same way), so speculative sampling stays exact for the
    *shaped* distribution.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k_sampling: int = 0  # 0 = no top-k truncation
    seed: int = 0

    def __post_init__(self) -> None:
        _check_float("temperature", self.temperature, 0.0, 100.0)
        _check_float("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _check_int("top_k_sampling", self.top_k_sampling, 0, MAX_TOP_K_SAMPLING)
        _check_int("seed", self.seed, 0, MAX_SEED)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationLimits:
    """Caps set by whoever hosts the engine (the CLI, a public Space)."""

    max_new_tokens: int = MAX_NEW_TOKENS
    max_prompt_chars: int = 20_000


def check_max_new_tokens(value, cap: int = MAX_NEW_TOKENS) -> int:
    _check_int("max_new_tokens", value, 1, cap)
    return value


def check_prompt(prompt, max_chars: int = GenerationLimits.max_prompt_chars) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt must be a non-empty, non-blank string")
    if len(prompt) > max_chars:
        raise ValueError(f"prompt must be at most {max_chars} characters, got {len(prompt)}")
    return prompt
