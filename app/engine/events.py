"""Step records: the only thing that crosses from the engine to its consumers.

Field names are the JSON-lines contract (the CLI's --jsonl, traces, the page); ``to_dict`` gives that form.
Every decoder yields one ``StepEvent`` per *target forward*, then one ``RunSummary``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

STATUSES = ("accepted", "rejected", "unreached")

# The acceptance rules, as a record names the one that ran (``StepEvent.rule``); defined here,
# with the records, so that their readers (the views, the trace schema) need no torch.
# ``app.engine.verify`` implements them and ``verify.rule_for`` picks one per step.
GREEDY, SAMPLED_CHAIN, SAMPLED_TREE = "greedy", "sampled_chain", "sampled_tree"
RULES = (GREEDY, SAMPLED_CHAIN, SAMPLED_TREE)


@dataclass(frozen=True)
class DraftTreeRecord:
    """The draft tree verified in one step. Node i is described by the i-th entry of each list.

    Nodes are ordered so that a parent always comes before its children.
    """

    root_token: int                 # last committed token; the tree hangs from it
    tokens: list[int]               # draft token id of node i
    texts: list[str]                # decoded text of node i's token
    parents: list[int]              # index of node i's parent, -1 = the root
    depths: list[int]               # 1 = child of the root
    q: list[float]                  # draft probability of node i given its parent (pld / lookahead:
                                    # a count share, marked by tree_config["q"] == "count")
    confidence: list[float]         # product of q along the root-to-node path (EAGLE-2's score)
    p: list[float] | None           # target probability of node i's token given its parent
    status: list[str]               # "accepted" | "rejected" | "unreached"
    source: list[str | None] | None = None   # who proposed node i where not the step's drafter:
                                    # "pld" for a prompt-lookup branch (TreeConfig.lookup), None
                                    # for the drafter's own nodes; None when all are its own (and
                                    # then left out of the JSON form, ``StepEvent.to_dict``)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class StepEvent:
    """One target forward: what was drafted, what the target accepted, what it added."""

    step: int                       # 0-based index of the target forward (0: the prefill)
    method: str                     # vanilla | dynamic | static | chain | threshold
    tree: DraftTreeRecord | None    # None for vanilla
    accepted: list[int]             # accepted draft token ids, in order
    bonus: int                      # the token the target itself produced after them
    new_tokens: list[int]           # accepted + [bonus], truncated at EOS / max_new_tokens
    text: str                       # decoded text of new_tokens
    rule: str = GREEDY              # acceptance rule that ran: one of RULES
    drafter: str | None = None      # what proposed the nodes: eagle2 | eagle3 | ... | None (no tree)
    tree_config: dict | None = None # the tree this step used, e.g. {"method": "dynamic", "depth": 2,
                                    # "top_k": 1, "total_tokens": 2}; None without a draft
    prefill: bool = False           # step 0: the forward over the whole prompt, whose last row
                                    # gives the first token (its time is not decoding time)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    step_ms: float = 0.0
    type: str = field(default="step", init=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["tree"] is not None and d["tree"]["source"] is None:
            del d["tree"]["source"]       # only a tree with a prompt-lookup branch carries the key
        return d


@dataclass(frozen=True)
class RunSummary:
    """Totals for one generation. ``new_tokens``, ``token_ids`` and ``text`` cover the whole
    answer; ``seconds``, ``tokens_per_s``, ``target_forwards`` and ``mean_accepted`` cover
    decoding after the prefill (the first token comes out of the prompt's forward for every
    method alike, so it is left out of every rate)."""

    method: str
    new_tokens: int
    seconds: float
    tokens_per_s: float
    target_forwards: int
    mean_accepted: float            # new tokens per target forward, bonus included (tau)
    accepted_by_depth: list[float]  # acceptance rate at depth 1, 2, ... (given the parent was accepted)
    token_ids: list[int]
    text: str
    type: str = field(default="summary", init=False)

    def to_dict(self) -> dict:
        return asdict(self)


def decoding_steps(steps: list[StepEvent]) -> list[StepEvent]:
    """The steps after the prefill: the ones whose time and tokens make a decoding rate."""
    return [s for s in steps if not s.prefill]


def summarize(method: str, steps: list[StepEvent], text: str) -> RunSummary:
    """Build the summary from the step records alone, so any consumer can recompute it."""
    token_ids = [t for s in steps for t in s.new_tokens]
    decoding = decoding_steps(steps)
    n = sum(len(s.new_tokens) for s in decoding)
    seconds = sum(s.step_ms for s in decoding) / 1000.0
    forwards = len(decoding)
    return RunSummary(
        method=method,
        new_tokens=len(token_ids),
        seconds=seconds,
        tokens_per_s=n / seconds if seconds > 0 else 0.0,
        target_forwards=forwards,
        mean_accepted=n / forwards if forwards else 0.0,
        accepted_by_depth=acceptance_by_depth(steps),
        token_ids=token_ids,
        text=text,
    )


def acceptance_by_depth(steps: list[StepEvent]) -> list[float]:
    """Acceptance rate at depth d: of the steps whose verification reached depth d-1 and whose
    tree had a node at depth d, the share that accepted a token at depth d."""
    reached: list[int] = []
    accepted: list[int] = []
    for s in steps:
        if s.tree is None or not len(s.tree):
            continue
        max_depth = max(s.tree.depths)
        k = len(s.accepted)
        for d in range(1, min(max_depth, k + 1) + 1):
            while len(reached) < d:
                reached.append(0)
                accepted.append(0)
            reached[d - 1] += 1
            accepted[d - 1] += int(k >= d)
    return [a / r for a, r in zip(accepted, reached)]


def event_from_dict(d: dict) -> StepEvent | RunSummary:
    """Inverse of ``to_dict`` for trusted input (our own traces). Untrusted traces must be
    validated by the caller first."""
    d = dict(d)
    kind = d.pop("type", None)
    if kind == "summary":
        return RunSummary(**d)
    if kind == "step":
        tree = d.pop("tree")
        tree_config = d.pop("tree_config", None)
        return StepEvent(tree=DraftTreeRecord(**tree) if tree is not None else None,
                         tree_config=dict(tree_config) if tree_config is not None else None, **d)
    raise ValueError(f"unknown record type {kind!r}")
