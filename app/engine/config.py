"""The config classes of one generation, which hold a request's values and check them.

``TreeConfig`` (how each step's draft tree is grown), ``SamplingConfig`` (how the target's
next token is chosen), ``GenerationLimits`` (the host's caps) and ``check_max_new_tokens`` /
``check_prompt`` check every value they own against the one specification of the knobs,
``spec.SPEC``, at the boundary: a bad value raises ``ValueError`` whose first word names the
setting, and nothing downstream re-checks. ``TreeShape`` reads and writes a tree's size in the
papers' "N/d/k" notation (total_tokens / depth / top_k).

Two different "top-k"s exist in speculative decoding, so they get two different names here:
``TreeConfig.top_k`` is the EAGLE-2 branching factor of the draft tree, and
``SamplingConfig.top_k_sampling`` truncates the *target's* sampling distribution.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from app.engine.drafters.registry import DRAFTER
from app.engine.spec import (HEAD_METHODS, KNOB, MAX_DEPTH, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, MAX_TOP_K,
                             MAX_TOTAL_TOKENS, SETTING, SPEC, TOP_K_SAMPLING, shown)

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


def _default(name: str):
    return KNOB[name].default


@dataclass(frozen=True)
class TreeConfig:
    """How the draft tree is grown each step.

    method:          vanilla (no draft) | dynamic (EAGLE-2) | static (EAGLE-1) | chain | threshold
                     | pld (prompt lookup) | lookahead (Jacobi n-grams) | medusa (Medusa heads)
    depth:           deepest level of drafted nodes (= draft forwards per step); pld: longest
                     continuation proposed; medusa: heads used (at most the heads loaded)
    top_k:           EAGLE-2 branching: nodes expanded per level, children proposed per node
    total_tokens:    at most this many draft nodes are verified (all tree methods). The root
                     (the last committed token) is not counted: the reference EAGLE code's
                     ``total_token=N`` counts it and drafts N - 1 nodes, so its N is our N - 1
    tau_high/low:    threshold method: a node with confidence > tau_high gets 2 children,
                     > tau_low 1 child, otherwise none
    min_confidence:  any method: drop nodes whose cumulative confidence is below this
    static_shape:    static and medusa: the tree as paths of child ranks (see DEFAULT_STATIC_SHAPE)
    ngram:           pld: longest n-gram of the context's end looked up (then shorter ones);
                     lookahead: N, the size of the n-grams collected (N - 1 tokens proposed)
    window:          lookahead: W, Jacobi guesses carried from step to step
    pool:            lookahead: n-grams kept per first token (the oldest are dropped)
    lookup:          head methods: also verify, as one more branch, up to this many tokens that
                     followed the context's last n-gram (n >= 2) where it occurred before
                     (prompt lookup beside the head: ``drafters.pld.NgramIndex``); 0 = off
    pld and lookahead put top_k candidate continuations in the tree (lookahead: top_k
    n-grams from the pool beside its window), at most total_tokens nodes in all.
    """

    method: str = _default("method")
    depth: int = _default("depth")
    top_k: int = _default("top_k")
    total_tokens: int = _default("total_tokens")
    tau_high: float = _default("tau_high")
    tau_low: float = _default("tau_low")
    min_confidence: float = _default("min_confidence")
    static_shape: tuple[tuple[int, ...], ...] = DEFAULT_STATIC_SHAPE
    ngram: int = _default("ngram")
    window: int = _default("window")
    pool: int = _default("pool")
    lookup: int = _default("lookup")

    def __post_init__(self) -> None:
        KNOB["method"].check(self.method)
        lowest = DRAFTER[self.method].lowest if self.method in DRAFTER else {}   # a drafter's own floors
        for s in SPEC:
            if s.owner == "tree":
                s.check(getattr(self, s.name), lo=lowest.get(s.name))
        # Only where the pair is used: a knob that does not shape this method's tree is
        # accepted unused (the page disables its control, so it could not be corrected there).
        if self.method == "threshold" and self.tau_low > self.tau_high:
            raise ValueError(
                f"tau_low must be <= tau_high (0 <= tau_low <= tau_high <= 1), "
                f"got tau_low={self.tau_low:g}, tau_high={self.tau_high:g}")
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
        if self.lookup and self.uses_head:
            out["lookup"] = self.lookup
        drafter = DRAFTER.get(self.method)
        if drafter is not None:
            out.update({knob: getattr(self, knob) for knob in drafter.knobs})
            if drafter.count_q:
                # its nodes' q is the share of candidates through the parent that continue with
                # the node's token (drafters.sequences.tree_from_sequences), not a probability
                out["q"] = "count"
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
        drafter = DRAFTER.get(self.method)
        if drafter is not None and drafter.max_path is not None:
            return drafter.max_path(self)
        return max(self.depth, self.lookup) if self.uses_head else self.depth

    @property
    def max_nodes(self) -> int:
        """The most draft nodes one step can verify: total_tokens, plus a prompt-lookup branch."""
        if not self.uses_draft:
            return 0
        return min(MAX_TOTAL_TOKENS, self.total_tokens + (self.lookup if self.uses_head else 0))

    @property
    def one_wide(self) -> bool:
        """A tree that is a chain: one child per level (method chain, or dynamic with top_k 1)."""
        return self.method == "chain" or (self.method == "dynamic" and self.top_k == 1)

    def samples_drafts(self, sampling: "SamplingConfig") -> bool:
        """Whether this step's drafts are *sampled* from q and verified by speculative sampling
        (``verify.chain_verify``: accept x with probability min(1, p(x)/q(x))) instead of taken
        as q's top-k and verified as fixed candidates (``verify.sequential_verify``).

        Only a chain can be, and under sampling a chain should be: a sampled draft is accepted
        with probability sum_x min(p(x), q(x)), a fixed top-1 draft with p(argmax q) only
        (the measured difference: benchmarks/engine-notes.md). Both rules are lossless;
        greedy decoding drafts q's argmax either way."""
        return self.one_wide and not sampling.greedy


@dataclass(frozen=True)
class SamplingConfig:
    """How the target's next token is chosen. temperature 0 = greedy.

    top_p and top_k_sampling shape the target distribution p (and, for sampled chains, the
    draft distribution q the same way), so speculative sampling stays exact for the
    *shaped* distribution.
    """

    temperature: float = _default("temperature")
    top_p: float = _default("top_p")
    top_k_sampling: int = TOP_K_SAMPLING.default  # 0 = no top-k truncation
    seed: int = _default("seed")

    def __post_init__(self) -> None:
        for s in SPEC:
            if s.owner == "sampling":
                s.check(getattr(self, s.name))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationLimits:
    """Caps set by whoever hosts the engine (the CLI, a public Space)."""

    max_new_tokens: int = MAX_NEW_TOKENS
    max_prompt_chars: int = MAX_PROMPT_CHARS


def check_max_new_tokens(value, cap: int = MAX_NEW_TOKENS) -> int:
    return SETTING["max_new_tokens"].check(value, cap)


def check_prompt(prompt, max_chars: int = MAX_PROMPT_CHARS) -> str:
    return SETTING["prompt"].check(prompt, max_chars)


@dataclass(frozen=True)
class TreeShape:
    """A tree's size in the papers' "N/d/k" notation: total_tokens / depth / top_k. The one
    place that notation is read (``parse``) and written (``str``)."""

    total_tokens: int
    depth: int
    top_k: int

    @classmethod
    def parse(cls, text, what: str = "tree") -> "TreeShape":
        """"60/5/10" -> TreeShape(60, 5, 10); ValueError starting with ``what`` otherwise.
        Only the form is checked here: the ranges are ``TreeConfig``'s (``config``)."""
        parts = text.split("/") if isinstance(text, str) else []
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"{what} must be TOTAL_TOKENS/DEPTH/TOP_K, e.g. 60/5/10, got {shown(text)}")
        total, depth, top_k = (int(p) for p in parts)
        return cls(total, depth, top_k)

    @classmethod
    def of(cls, tree) -> "TreeShape":
        """The shape of a ``TreeConfig``, or of a step record's ``tree_config`` dict."""
        get = tree.get if isinstance(tree, dict) else lambda k: getattr(tree, k)
        return cls(get("total_tokens"), get("depth"), get("top_k"))

    def __str__(self) -> str:
        return f"{self.total_tokens}/{self.depth}/{self.top_k}"

    @classmethod
    def key(cls, tree) -> str:
        """"N/d/k" of a tree that drafts (a ``TreeConfig``, or a step record's ``tree_config``),
        "vanilla" for a step without a draft (a record's ``tree_config`` is then None): how the
        adaptive tree and the benchmark name the trees a run moves between."""
        if tree is None or (isinstance(tree, TreeConfig) and not tree.uses_draft):
            return "vanilla"
        return str(cls.of(tree))

    def knobs(self) -> dict:
        return {"total_tokens": self.total_tokens, "depth": self.depth, "top_k": self.top_k}

    def config(self, method: str = "dynamic", base: TreeConfig | None = None) -> TreeConfig:
        """A ``TreeConfig`` of this shape (``base``'s other knobs, else the defaults)."""
        if base is None:
            return TreeConfig(method=method, **self.knobs())
        return replace(base, method=method, **self.knobs())
