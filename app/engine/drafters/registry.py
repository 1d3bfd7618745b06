"""The drafters the engine knows, one line each: what names them, what they read, where they live.

This module imports nothing but the standard library, so the settings (``app.engine.spec``),
the trace schema and the page can read the catalogue without loading torch or a drafter. A
drafter's code is imported the first time a run starts it (``app.engine.drafters.start``).

Adding a drafter: a new module in this package with a class that follows
``app.engine.drafters.Drafter`` (start / draft / observe), and one line in ``DRAFTERS``. Its
method then exists for the settings (``spec.METHODS``), the CLI and the bench (their
``--method`` choices), the trace schema (its ``drafter`` name), the page's tree legend
(``label``) and *Compare methods* (its ``facts``: name, colour, published numbers).

Each method the page shows also has its facts here, one entry per method (``MethodFacts``:
its name on the page, its colour in every figure, and what its paper and Spec-Bench report):
a drafter's in its ``DrafterInfo`` line, the EAGLE heads' trees in their ``HeadInfo`` line,
plain decoding in ``VANILLA``. ``METHODS`` gathers them under the names the page's
comparison uses (``dynamic@eagle3`` for a tree of another head kind), and the page, its
figures and its "How it works" text read them from there (``app.viz.methods``,
``app.viz.style``, ``app.ui.explain``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Published:
    """What the literature reports for one method (greedy, batch 1, on a GPU).

    paper:         where the method comes from, as the page names it ("EAGLE-2 (Li et al., 2024)")
    citation:      the paper's address ("" where there is no paper)
    paper_speedup: the speedup its own paper reports, with the setting
    spec_bench:    Spec-Bench's overall speedup (``SPEC_BENCH``), a common yardstick; "–" where not listed
    lossless:      whether its output is the target's own
    training:      what it needs trained
    """

    paper: str
    citation: str
    paper_speedup: str
    spec_bench: str
    lossless: str
    training: str


@dataclass(frozen=True)
class MethodFacts:
    """One decoding method as every view of the page shows it.

    name:      its name on the page ("EAGLE-2 (dynamic tree)"), in tables, legends and choices
    colour:    its colour in every figure, so a method looks the same everywhere
    published: what the literature reports for it; None for a method no paper describes as such
    """

    name: str
    colour: str
    published: Published | None = None


# Spec-Bench: Xia et al. 2024, leaderboard, Vicuna-7B v1.3 on one RTX 3090, greedy, fp16,
# overall over six tasks (prompt lookup 2.31x on summarisation).
SPEC_BENCH = "https://arxiv.org/abs/2401.07851"


@dataclass(frozen=True)
class DrafterInfo:
    """One drafter that is not the EAGLE head.

    method:   the ``TreeConfig.method`` that selects it; also its name in the step records
    label:    what the page calls its tree's proposer ("prompt lookup")
    target:   "module:Class" of its ``Drafter``, imported when a run first starts it
    knobs:    the ``TreeConfig`` knobs it reads besides depth / top_k / total_tokens (recorded in
              each step's ``tree_config``)
    lowest:   a knob's lower bound where this drafter needs more than the setting's range
              (lookahead collects n-grams of at least 2 tokens)
    count_q:  its nodes' q is a count of agreeing candidates (``sequences.tree_from_sequences``),
              not a model's probability; the step records say so (``tree_config["q"]``)
    weights:  the engine attribute holding the trained weights it needs ("" for none)
    max_path: the most draft tokens one step can accept, where it is not ``depth``
    proposes: how it proposes a step's nodes, in the page's words (after "… proposed N nodes,")
    facts:    the method's name, colour and published numbers (``MethodFacts``)
    """

    method: str
    label: str
    target: str
    knobs: tuple[str, ...] = ()
    lowest: dict = field(default_factory=dict)
    count_q: bool = False
    weights: str = ""
    max_path: Callable | None = None
    proposes: str = ""
    facts: MethodFacts | None = None


DRAFTERS: tuple[DrafterInfo, ...] = (
    DrafterInfo("pld", "prompt lookup", "app.engine.drafters.pld:PromptLookup", knobs=("ngram",), count_q=True,
                proposes="copied from where the text's last tokens appeared before; no model ran",
                facts=MethodFacts("prompt lookup", "#b45309", Published(
                    "prompt lookup decoding (Saxena, 2023)", "https://github.com/apoorvumang/prompt-lookup-decoding",
                    "no paper; gains where the answer copies the prompt", "1.55× (2.31× on summaries)", "yes",
                    "none"))),
    DrafterInfo("lookahead", "lookahead pool", "app.engine.drafters.lookahead:Lookahead",
                knobs=("ngram", "window", "pool"), lowest={"ngram": 2}, count_q=True,
                max_path=lambda cfg: min(cfg.total_tokens, max(cfg.window, cfg.ngram - 1)),
                proposes="its Jacobi window and the n-grams of its pool; no model ran",
                facts=MethodFacts("lookahead", "#0891b2", Published(
                    "Lookahead decoding (Fu et al., 2024)", "https://arxiv.org/abs/2402.02057",
                    "1.8× (MT-bench, LLaMA-2-7B-chat)", "1.08×", "yes", "none"))),
    DrafterInfo("medusa", "Medusa heads", "app.engine.drafters.medusa:MedusaDrafter", weights="medusa",
                proposes="each head's top tokens for its own depth, from one pass over the last feature",
                facts=MethodFacts("Medusa", "#be185d", Published(
                    "Medusa (Cai et al., 2024)", "https://arxiv.org/abs/2401.10774", "2.2× (Medusa-1, Vicuna-7B)",
                    "1.44×", "yes with exact verification (its 'typical acceptance' is not)",
                    "extra heads; target frozen"))),
)
DRAFTER: dict[str, DrafterInfo] = {d.method: d for d in DRAFTERS}


@dataclass(frozen=True)
class HeadInfo:
    """One kind of EAGLE head.

    kind:  as the step records name the drafter of its trees; the head's ``kind`` attribute
           holds it (a head without one is EAGLE-1/2's)
    label: what the page calls its trees' proposer ("EAGLE head")
    trees: the page's methods this head drafts, by tree method (``spec.HEAD_METHODS``), with
           their facts; the page names a head of another kind than the default's ``TREE@KIND``
    """

    kind: str
    label: str
    trees: dict[str, MethodFacts]


# EAGLE-2's green is the page's accepted-draft colour (app.viz.style.DRAFT): the race draws
# every head method in it.
HEADS: tuple[HeadInfo, ...] = (
    HeadInfo("eagle2", "EAGLE head", {
        "static": MethodFacts("EAGLE-1 (static tree)", "#7c3aed", Published(
            "EAGLE (Li et al., 2024)", "https://arxiv.org/abs/2401.15077", "2.7–3.5× (LLaMA2-Chat 70B)", "2.16×",
            "yes", "one decoder layer (the draft head)")),
        "dynamic": MethodFacts("EAGLE-2 (dynamic tree)", "#15803d", Published(
            "EAGLE-2 (Li et al., 2024)", "https://arxiv.org/abs/2406.16858", "3.05–4.26×", "2.25×", "yes",
            "the EAGLE head, unchanged")),
        "chain": MethodFacts("chain (one guess a level)", "#ca8a04"),
        "threshold": MethodFacts("threshold tree", "#4338ca"),
    }),
    HeadInfo("eagle3", "EAGLE-3 head", {
        "dynamic": MethodFacts("EAGLE-3 (dynamic tree)", "#1d4ed8", Published(
            "EAGLE-3 (Li et al., 2025)", "https://arxiv.org/abs/2503.01840", "up to 6.5× (about 1.4× EAGLE-2's)", "–",
            "yes", "a draft layer on fused low/mid/high features, training-time test")),
    }),
)
DEFAULT_HEAD_KIND = "eagle2"

# The EAGLE heads' kinds with the page's label for each.
HEAD_KINDS: dict[str, str] = {h.kind: h.label for h in HEADS}

# Plain decoding, the yardstick of every ratio.
VANILLA = MethodFacts("vanilla", "#6b7280", Published("one target forward per token", "", "1×", "1×", "yes", "none"))


def _methods() -> dict[str, MethodFacts]:
    out = {"vanilla": VANILLA}
    out.update({d.method: d.facts for d in DRAFTERS})
    for h in HEADS:
        out.update({tree if h.kind == DEFAULT_HEAD_KIND else f"{tree}@{h.kind}": facts for tree, facts in h.trees.items()})
    return out


# Every method the page shows, by the name its comparison uses, with its facts: vanilla, the
# drafters, the default head's trees, then ``TREE@KIND`` for the other head kinds.
METHODS: dict[str, MethodFacts] = _methods()

# Every name a step record's ``drafter`` may hold, with the page's label for it.
DRAFTER_LABELS: dict[str, str] = {**HEAD_KINDS, **{d.method: d.label for d in DRAFTERS}}


def head_kind(head) -> str:
    """The step records' drafter name for an EAGLE head."""
    return getattr(head, "kind", DEFAULT_HEAD_KIND)
