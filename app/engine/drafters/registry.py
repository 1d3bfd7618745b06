"""The drafters the engine knows, one line each: what names them, what they read, where they live.

This module imports nothing but the standard library, so the settings (``app.engine.spec``),
the trace schema and the page can read the catalogue without loading torch or a drafter. A
drafter's code is imported the first time a run starts it (``app.engine.drafters.start``).

Adding a drafter: a new module in this package with a class that follows
``app.engine.drafters.Drafter`` (start / draft / observe), and one line in ``DRAFTERS``. Its
method then exists for the settings (``spec.METHODS``), the CLI and the bench (their
``--method`` choices), the trace schema (its ``drafter`` name) and the page's tree legend
(``label``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


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


DRAFTERS: tuple[DrafterInfo, ...] = (
    DrafterInfo("pld", "prompt lookup", "app.engine.drafters.pld:PromptLookup", knobs=("ngram",), count_q=True,
                proposes="copied from where the text's last tokens appeared before; no model ran"),
    DrafterInfo("lookahead", "lookahead pool", "app.engine.drafters.lookahead:Lookahead",
                knobs=("ngram", "window", "pool"), lowest={"ngram": 2}, count_q=True,
                max_path=lambda cfg: min(cfg.total_tokens, max(cfg.window, cfg.ngram - 1)),
                proposes="its Jacobi window and the n-grams of its pool; no model ran"),
    DrafterInfo("medusa", "Medusa heads", "app.engine.drafters.medusa:MedusaDrafter", weights="medusa",
                proposes="each head's top tokens for its own depth, from one pass over the last feature"),
)
DRAFTER: dict[str, DrafterInfo] = {d.method: d for d in DRAFTERS}

# The EAGLE heads' kinds, as the step records name the drafter of a head's tree, and the page's
# label for each. The head's ``kind`` attribute holds one (a head without it is EAGLE-1/2's).
HEAD_KINDS: dict[str, str] = {"eagle2": "EAGLE head", "eagle3": "EAGLE-3 head"}
DEFAULT_HEAD_KIND = "eagle2"

# Every name a step record's ``drafter`` may hold, with the page's label for it.
DRAFTER_LABELS: dict[str, str] = {**HEAD_KINDS, **{d.method: d.label for d in DRAFTERS}}


def head_kind(head) -> str:
    """The step records' drafter name for an EAGLE head."""
    return getattr(head, "kind", DEFAULT_HEAD_KIND)
