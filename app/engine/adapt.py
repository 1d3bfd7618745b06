"""Adapting the draft tree while decoding: move between a few candidate trees to maximise the
tokens per second measured so far (EAGLE's "adjust the draft length from recent acceptance",
with the step's cost measured instead of assumed).

Why: the best tree depends on two things that change during a run. Acceptance follows the
text (a code block or a list is easy to draft, free prose is not), and on a shared CPU a
step's cost follows the load (a neighbour takes a core and big trees suffer more). A tree
chosen once at start-up is right for neither for long.

How (a small bandit over trees, every number measured by the run itself):

* each candidate c keeps an exponential moving average of its tokens per step tau_c and of
  its step time ms_c; the next step runs the c with the highest tau_c / ms_c. tau_c starts
  at a prior (the calibration's, else an optimistic guess) that observations move away from
  step by step: one unlucky step (tau 1 where 2.2 is usual) must not bench a tree for the
  rest of the run. A step time more than twice the estimate counts as twice it (a
  neighbour's burst, a page fault). The prefill is not observed: it reads the prompt
  through the target and the head, a one-off that says nothing about any tree;
* a top-1 chain of depth D that accepted k drafts also tells what every shorter chain of
  depth d <= D would have accepted: min(k, d) (a shorter chain's nodes are the first d nodes
  of the longer one). So one step updates the acceptance of all shorter chains;
* every ``explore_every`` steps another candidate runs once, so estimates that go stale get
  refreshed: the one with the highest estimated rate, raised the less it has been observed
  (``promise``), so a tree judged on one unlucky step gets another look before a tree
  judged on twenty.

Output never depends on the tree: greedy output is that of plain decoding for any tree,
and speculative sampling is exact for any tree chosen before its step drafts (the choice
uses only the past). So adaptation changes speed only. Each step record's ``tree_config``
says which tree ran.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from app.engine.autotune import choose_tree
from app.engine.config import TreeConfig, TreeShape


def chain(depth: int, base: TreeConfig = TreeConfig()) -> TreeConfig:
    """A top-1 chain of ``depth`` nodes: EAGLE-2's dynamic tree with top_k 1."""
    return replace(base, method="dynamic", depth=depth, top_k=1, total_tokens=depth)


VANILLA = TreeConfig(method="vanilla")

# The adaptive "auto" tree also verifies a prompt-lookup branch of up to this many tokens
# (``TreeConfig.lookup``): on the six evaluation suites it raised tau at 4/2/2 from 1.84 to
# 2.12 and tokens/s by 13% over the head's tree alone (benchmarks/fast-forward/lookup-branch.md).
AUTO_LOOKUP = 3
# ... and more where the verify forward takes 8 or more rows for about the price of one
# (AVX-512: one register block of 8 rows; AMX tiles: 16). The branch still only fills the
# rows the head's tree leaves free (``Engine._with_lookup_branch``), and beyond them takes the
# places of the head's least confident nodes. With 16 free rows (the AMX Xeon) a branch of 8
# beat one of 3 by 2-7% in three runs (benchmarks/fast-forward/amx.md). With 8 (a Zen 5
# EPYC), 8 beat 3 (1.50-1.59x our vanilla against 1.46-1.55x, zen5.md), and 5 beat 8 in four
# interleaved runs of 24 prompts (+0.6 to +3.7%: a branch of 8 displaced more of the head's
# nodes and cost rows on long prompts, sum 1.23x against 1.32x; lookup-branch.md).
WIDE_LOOKUP = 5
WIDE_ROWS = 8
WIDEST_LOOKUP = 8
WIDEST_ROWS = 16


def auto_lookup(engine) -> int:
    """The prompt-lookup branch of the adaptive default on ``engine``, by the rows its verify
    forward computes at about the cost of one (``Engine.free_rows``): ``WIDEST_LOOKUP`` from
    ``WIDEST_ROWS``, ``WIDE_LOOKUP`` from ``WIDE_ROWS``, else ``AUTO_LOOKUP``."""
    free = engine.free_rows or 0
    return WIDEST_LOOKUP if free >= WIDEST_ROWS else WIDE_LOOKUP if free >= WIDE_ROWS else AUTO_LOOKUP


# Small EAGLE-2 trees (total/depth/top_k) beside the chains: where a forward over 4-5 rows
# costs about one over a single row (the fast forward on a CPU), two children at each of two
# levels accept more than a chain of the same size. Measured over the six suites (12 prompts,
# 128 tokens, native bfloat16): 3/2/2 and 4/2/2 1.76x and 1.71x our vanilla with a
# prompt-lookup branch, the chains 2/2/1 1.62x and 3/3/1 1.37x (without one).
SMALL_TREES = ((3, 2, 2), (4, 2, 2))
# ... whose nodes below this confidence (EAGLE-2's estimate of the chance the path is
# accepted) are not verified: where a verify row costs real time (AVX2 in a fast memory
# phase: ~0.5 ms a row), a node accepted one time in ten does not pay for its row.
SMALL_TREE_MIN_CONFIDENCE = 0.1


# The deepest top-1 chain among the default candidates. On a CPU, with a prompt-lookup branch
# beside them, deeper chains (3/3/1, 4/4/1) cost more in first tries and exploration (every
# candidate runs once per run, then now and then) than they returned: over the six suites (24 prompts, 128
# tokens, interleaved) dropping them took the adaptive default from 1.48x to 1.53x our
# vanilla natively (a fixed 3/2/2 ran 1.53x) and from 1.31x to 1.35x under AVX2 emulation.
# Where drafting is cheap (a GPU), the tuned tree ``best`` brings the depth.
MAX_CHAIN = 2


def default_candidates(best: TreeConfig | None = None, max_chain: int = MAX_CHAIN,
                       base: TreeConfig = TreeConfig(), free_rows: int | None = None) -> list[TreeConfig]:
    """Plain decoding (no draft: where no tree pays, e.g. a CPU with no spare compute, the run
    can still fall back to it), chains of depth 1..``max_chain``, the ``SMALL_TREES`` and, if
    it is not one of them, the tree ``best`` (e.g. the one tuned for this machine), all with
    ``base``'s other knobs, smallest first.

    ``free_rows``: the verify forward's rows that cost about one (``Engine.free_rows``, the
    fast kernels' register block: 4 with AVX2). A small tree whose root and nodes do not fit
    leaves that block: under AVX2 emulation 4/2/2 cost 1.3x a step of 3/2/2 (46 against
    35 ms) for 2.07 tokens against 1.96, and the adaptive default still ran it on 9% of its
    steps (first tries and refreshes). It is not a candidate there; ``best`` (priced by the
    measured cost curve) always is."""
    out = [VANILLA] + [chain(d, base) for d in range(1, max_chain + 1)]
    out += [replace(base, method="dynamic", total_tokens=n, depth=d, top_k=k,
                    min_confidence=max(base.min_confidence, SMALL_TREE_MIN_CONFIDENCE)) for n, d, k in SMALL_TREES
            if free_rows is None or n + 1 <= free_rows]
    if best is not None and best.method == "dynamic" and not any(_same(best, c) for c in out):
        out.append(replace(best, min_confidence=0.0))
    return sorted(out, key=lambda t: (t.uses_draft, t.total_tokens, t.depth, t.top_k))


def _as_chain(t: TreeConfig) -> TreeConfig:
    """A dynamic tree of one node is the 1-node chain whatever its depth and top_k (its one
    node is the root's most confident child); other trees as they are."""
    return chain(1, t) if t.method == "dynamic" and t.total_tokens == 1 else t


def _same(a: TreeConfig, b: TreeConfig) -> bool:
    """Whether two trees draft the same nodes (a one-node dynamic tree is the 1-node chain:
    as two candidates they would split one tree's observations and double its exploration)."""
    a, b = _as_chain(a), _as_chain(b)
    return (a.method, a.depth, a.top_k, a.total_tokens) == (b.method, b.depth, b.top_k, b.total_tokens)


def _path_end(event) -> int:
    """The last accepted node of a step (its index in the step's tree); the step accepted some."""
    return max(i for i, status in enumerate(event.tree.status) if status == "accepted")


def _is_chain(t: TreeConfig) -> bool:
    return t.one_wide and t.total_tokens >= t.depth


# A step time above this many times its tree's estimate is counted as this many times it.
OUTLIER = 2.0
# How much exploration favours a little-observed candidate (``TreeAdapter.promise``).
EXPLORE_BONUS = 0.5


@dataclass
class _Arm:
    tree: TreeConfig
    tau: float                 # EMA of tokens per step (accepted drafts + the bonus)
    ms: float | None = None    # EMA of step time; None until it has run
    runs: int = 0
    tau_seen: int = 0          # observations behind tau (its own runs + deeper chains')


@dataclass
class TreeAdapter:
    """Pick each step's tree among ``candidates`` (see the module docstring).

    ``prior_tau``: the tokens per step assumed for a candidate before it is observed (e.g. from
    the calibration of ``autotune``); by default an optimistic 1 + 0.7 + 0.7² + ... so that
    every candidate gets tried. ``decay`` weights the newest observation in the averages.
    """

    candidates: Sequence[TreeConfig]
    decay: float = 0.25
    explore_every: int = 12
    prior_tau: dict | None = None
    arms: list[_Arm] = field(init=False, default_factory=list)
    current: int = field(init=False, default=0)
    steps: int = field(init=False, default=0)
    switches: list[tuple[int, int, str]] = field(init=False, default_factory=list)   # (step, arm, why)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("candidates must hold at least one tree")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        self.candidates = list(self.candidates)

    # --- the engine's side -----------------------------------------------------------------

    def largest(self, base: TreeConfig) -> TreeConfig:
        """A tree at least as deep and as large as every candidate (for the engine's capacity
        checks and KV buffers)."""
        trees = [t for t in self.candidates if t.uses_draft] or [chain(1)]
        return replace(base, method="dynamic", depth=max(t.depth for t in trees),
                       total_tokens=max(t.total_tokens for t in trees), lookup=max(t.lookup for t in trees))

    def start(self, tree: TreeConfig | None = None) -> None:
        """Reset for a new run; start at ``tree`` if it is a candidate, else the smallest."""
        prior = self.prior_tau or {}
        self.arms = [_Arm(t, tau=1.0 if not t.uses_draft else
                          prior.get(self._key(t), 1.0 + sum(0.7 ** d for d in range(1, t.depth + 1))))
                     for t in self.candidates]
        self.current = next((i for i, a in enumerate(self.arms) if tree is not None and _same(a.tree, tree)), 0)
        self.steps, self.switches = 0, []

    def next_tree(self) -> TreeConfig:
        """The tree for the next step."""
        if not self.arms:
            self.start()
        untried = [i for i, a in enumerate(self.arms) if a.ms is None]
        if untried:                              # every candidate runs once first, nearest first
            pick = min(untried, key=lambda i: abs(i - self.current))
            why = "first try"
        elif self.steps and self.steps % self.explore_every == 0 and len(self.arms) > 1:
            best = self.best()
            pick = max((i for i in range(len(self.arms)) if i != best), key=self.promise)
            why = "refresh the most promising other estimate"
        else:
            pick = self.best()
            why = "highest measured tokens/s"
        if pick != self.current:
            self.switches.append((self.steps, pick, why))
        self.current = pick
        return self.arms[pick].tree

    def observe(self, event) -> None:
        """Learn from one step record (its ``tree_config``, ``accepted``, ``step_ms``)."""
        if event.prefill:
            return
        self.steps += 1
        arm = self._arm_of(event.tree_config or VANILLA.shape())     # a step without a draft: the vanilla arm
        if arm is None:
            return
        k = len(event.accepted)
        done = len(event.new_tokens) < len(event.accepted) + 1     # cut by EOS / the budget: no full bonus
        a = self.arms[arm]
        a.runs += 1
        ms = event.step_ms if a.ms is None else min(event.step_ms, OUTLIER * a.ms)
        a.ms = ms if a.ms is None else (1 - self.decay) * a.ms + self.decay * ms
        if done or not a.tree.uses_draft:
            return
        if _is_chain(a.tree):      # a chain of depth D tells every shorter chain: min(k, d)
            # ... unless the path ended on a prompt-lookup branch, which a shorter chain has too
            source = event.tree.source if event.tree is not None else None
            copied = bool(k) and source is not None and source[_path_end(event)] is not None
            for other in self.arms:
                if _is_chain(other.tree) and other.tree.depth <= a.tree.depth:
                    self._learn_tau(other, 1 + (k if copied else min(k, other.tree.depth)))
        else:
            self._learn_tau(a, 1 + k)

    # --- estimates --------------------------------------------------------------------------

    def _learn_tau(self, arm: _Arm, tau: float) -> None:
        arm.tau = (1 - self.decay) * arm.tau + self.decay * tau      # from the prior, never replacing it
        arm.tau_seen += 1

    def rate(self, i: int) -> float:
        """Estimated tokens per ms of candidate i (0 before it has run)."""
        a = self.arms[i]
        return a.tau / a.ms if a.ms else 0.0

    def promise(self, i: int) -> float:
        """Candidate i's estimated tokens per ms, raised by how little its acceptance has been
        observed (by ``EXPLORE_BONUS`` / sqrt(1 + observations)): what exploration refreshes
        next. A tree seen once, on a step that accepted little, keeps a chance; one seen often,
        little. Plain decoding gets no raise: its tokens per step are exactly 1, never an
        estimate, and a step of it where a tree pays gives up most of a step's tokens."""
        a = self.arms[i]
        if not a.tree.uses_draft:
            return self.rate(i)
        return self.rate(i) * (1 + EXPLORE_BONUS / math.sqrt(1 + max(a.runs, a.tau_seen)))

    def best(self) -> int:
        """The candidate with the highest estimated tokens/s (ties: the smaller tree)."""
        return max(range(len(self.arms)), key=lambda i: (self.rate(i), -i))

    def _arm_of(self, shape: dict) -> int | None:
        for i, a in enumerate(self.arms):
            t = a.tree
            if (shape.get("method"), shape.get("depth"), shape.get("top_k"), shape.get("total_tokens")) == \
                    (t.method, t.depth, t.top_k, t.total_tokens):
                return i
        return None

    @staticmethod
    def _key(t: TreeConfig) -> str:
        """"total/depth/top_k" of a tree (the papers' N/d/k), "vanilla" for no draft."""
        return TreeShape.key(t)

    def summary(self) -> list[dict]:
        """Per candidate: its tree, runs, tau and ms estimates (for the page and the CLI)."""
        return [{"tree": self._key(a.tree), "runs": a.runs, "tau": round(a.tau, 3),
                 "ms": round(a.ms, 2) if a.ms else None,
                 "tokens_per_s": round(1000 * self.rate(i), 2)} for i, a in enumerate(self.arms)]


def adapter_for(engine, base: TreeConfig = TreeConfig(), measure: bool = False, progress=None,
                lookup: int | None = None, probe_ms: dict | None = None):
    """The adaptive "auto" tree for ``engine``: (start tree, TreeAdapter, TreeChoice or None).

    Every candidate that drafts also verifies a prompt-lookup branch of ``lookup`` tokens
    (None: ``auto_lookup(engine)``; 0: none).

    With a kept profile of this machine (``autotune``: cost curve + calibration) the tuned
    tree joins the candidates and the calibration's tau of each candidate is the adapter's
    prior; without one, ``measure=False`` starts from the 2-node chain with optimistic priors
    and lets the run's own measurements decide (no foreground calibration), while
    ``measure=True`` measures the profile first (seconds to a minute on a CPU, then kept).
    A profile kept for another thread count serves too (``autotune.kept_cost_curve``, scaled
    by ``probe_ms``, the thread probe of this start).
    """
    base = replace(base, lookup=auto_lookup(engine) if lookup is None else lookup)
    tree, choice = choose_tree(engine, base=base, measure=measure, progress=progress, probe_ms=probe_ms)
    if choice is None:
        return chain(2, base), TreeAdapter(default_candidates(base=base, free_rows=engine.free_rows)), None
    candidates = default_candidates(tree, base=base, free_rows=engine.free_rows)
    prior = {}
    for c in choice.candidates:
        top_k = c.top_k or choice.calibration_top_k
        prior.setdefault(str(TreeShape(c.total_tokens, c.depth, top_k)), c.tau)
    start = next((t for t in candidates if _same(t, tree)), chain(2, base))
    return start, TreeAdapter(candidates, prior_tau=prior), choice
