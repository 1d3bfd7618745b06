"""A plain-words account of one step's three phases: draft, verify, accept."""
from __future__ import annotations

from app.engine.config import TreeShape
from app.engine.drafters.registry import DEFAULT_HEAD_KIND, DRAFTER, DRAFTER_LABELS
from app.engine.events import StepEvent
from app.engine.events import GREEDY, SAMPLED_CHAIN, SAMPLED_TREE
from app.viz.stream import split_step_text
from app.viz.tree import show_token


# at most this many checked nodes are explained one by one (a big tree checks a dozen)
MAX_EXPLAINED = 6

def acceptance_rule(step: StepEvent) -> str:
    """Markdown: the acceptance rule that ran (``step.rule``, set by the engine), in this
    step's numbers, for every node the target checked.

    - ``GREEDY``: a node is kept iff it is the target's top token there (its p is the largest);
    - ``SAMPLED_CHAIN`` (drafts *sampled* from q): kept with probability min(1, p/q), else the
      bonus is drawn from what p has beyond q;
    - ``SAMPLED_TREE`` (children are q's top-k): siblings are tried in turn, each kept with its
      p under what is left of p once the refused ones are removed.
    """
    tree, rule = step.tree, step.rule
    if tree is None or not len(tree) or not tree.p:
        return ""
    checked = [i for i, st in enumerate(tree.status) if st != "unreached"]
    checked.sort(key=lambda i: (tree.depths[i], tree.status[i] != "accepted", i))
    by_parent = {tree.parents[i]: i for i, st in enumerate(tree.status) if st == "accepted"}
    _, bonus = split_step_text(step)
    bonus_text = f"`{show_token(bonus, escape=False)}`" if len(step.new_tokens) > len(step.accepted) else "the bonus token"
    lines = []
    for i in checked[:MAX_EXPLAINED]:
        tok = f"`{show_token(tree.texts[i], escape=False)}`"
        ok = tree.status[i] == "accepted"
        p_i, q_i = tree.p[i], tree.q[i]
        if rule == GREEDY:
            if ok:
                lines.append(f"{tok}: the target's top token here (p = {p_i:.2g}) ✓")
            else:
                top = by_parent.get(tree.parents[i])
                choice = f"`{show_token(tree.texts[top], escape=False)}`" if top is not None else bonus_text
                lines.append(f"{tok}: p = {p_i:.2g}, not the target's top token ({choice} is) ✗")
        elif rule == SAMPLED_CHAIN:
            keep = min(1.0, p_i / q_i) if q_i > 0 else 0.0
            lines.append(f"{tok}: drawn from q (q = {q_i:.2g}), target p = {p_i:.2g} → kept with probability "
                         f"min(1, p/q) = {keep:.2f} {'✓' if ok else '✗'}")
        else:
            lines.append(f"{tok}: target p = {p_i:.2g} {'✓ kept' if ok else '✗ refused'}")
    more = len(checked) - MAX_EXPLAINED
    if rule == SAMPLED_CHAIN:
        head = ("**Why** (sampling, a chain drafted by sampling from the head's q): each token is kept with "
                "probability min(1, p/q); after a refusal the bonus is drawn from max(0, p − q), renormalised — "
                "so the output is distributed exactly as the target's.")
    elif rule == SAMPLED_TREE:
        head = ("**Why** (sampling, a tree of q's top-k guesses): at each node the target tries the children in "
                "turn, keeping one with its probability under p with the refused ones removed; if all are "
                "refused, the bonus is drawn from what is left.")
    else:
        head = "**Why** (greedy): a node is kept only if it is the target's own top token at that point."
    return head + "\n" + "".join(f"\n- {line}" for line in lines) + (f"\n- … {more} more" if more > 0 else "")


def step_number(steps: list[StepEvent], index: int) -> int:
    """The number a person reads for ``steps[index]``: decoding steps count from 1, the prefill
    (record 0 of a run) is "the prefill". A record's own ``step`` field stays 0-based (it is
    the index of the target forward); with a prefill in front the two agree."""
    return index if steps and steps[0].prefill else index + 1


def decoding_total(steps: list[StepEvent]) -> int:
    """How many decoding steps ``steps`` holds (the prefill left out)."""
    return len(steps) - (1 if steps and steps[0].prefill else 0)


def tree_shape(config: dict | None) -> str:
    """A step's tree in the papers' N/d/k notation (total_tokens / depth / top_k)."""
    if not config or config.get("method") == "vanilla":
        return "no tree"
    return str(TreeShape.of(config))


# why an adaptive run changed its tree (``TreeAdapter.switches``), in words
SWITCH_REASONS = {
    "first try": "the run tries every candidate tree once, to measure it",
    "highest measured tokens/s": "the run measured it faster",
    "refresh the most promising other estimate": "now and then the run re-measures another tree, "
                                                 "the most promising for how little it has been measured",
}


def tree_change(step: StepEvent, previous: StepEvent | None, why: str | None = None) -> str:
    """A line for the step account when this step's tree differs from the previous step's
    (an adaptive run, ``app.engine.adapt``), else "". ``why``: the adapter's reason, if known."""
    if previous is None or previous.prefill or step.prefill:
        return ""
    now, before = step.tree_config, previous.tree_config
    if not now or not before or tree_shape(now) == tree_shape(before):
        return ""
    reason = SWITCH_REASONS.get(why, "an adaptive run picks the tree with the best tokens/s measured so far")
    return f"**Tree changed: {tree_shape(now)}, was {tree_shape(before)}** — {reason}."


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def draft_account(step: StepEvent) -> str:
    """Markdown: who proposed the step's nodes, how many and over how many levels, and how.

    An EAGLE head runs its layer once a level; the other drafters say how they propose
    (``DrafterInfo.proposes``). Nodes another source hung beside the drafter's (the
    prompt-lookup branch, ``DraftTreeRecord.source``) are counted apart: they are not the
    head's, and their depth is not the head's levels."""
    tree = step.tree
    source = tree.source or [None] * len(tree)
    own = [i for i, s in enumerate(source) if s is None]
    who = step.drafter or (step.method if step.method in DRAFTER else DEFAULT_HEAD_KIND)
    info = DRAFTER.get(who)
    how = info.proposes if info else "one small forward of its layer a level"
    levels = max((tree.depths[i] for i in own), default=0)
    text = (f"1. **Draft**: the {DRAFTER_LABELS.get(who, who)} proposed "
            f"**{_plural(len(own), 'node')} in {_plural(levels, 'level')}** ({how})")
    for other in dict.fromkeys(s for s in source if s is not None):        # in first-seen order
        n = source.count(other)
        extra = DRAFTER[other].proposes if other in DRAFTER else ""
        text += (f"; {DRAFTER_LABELS.get(other, other)} added **{n} more** beside them, in orange"
                 + (f" ({extra})" if extra else ""))
    return text + f". Drafting took {step.draft_ms:.1f} ms.\n"


def phase_account(step: StepEvent | None, total_steps: int | None = None, number: int | None = None,
                  previous: StepEvent | None = None, why: str | None = None) -> str:
    """Markdown: what the draft head proposed, what the one target forward checked, and what
    was kept, and why (``acceptance_rule`` under the rule the step records).

    ``number``: the step's number as a person reads it (``step_number``; by default its
    record index), ``total_steps``: the run's decoding steps (``decoding_total``). The
    prefill is called the prefill. ``previous``: the step before, to say when an adaptive run
    changed its tree (``tree_change``). Token texts are escaped (they may come from a
    stranger's trace)."""
    if step is None:
        return "_No step to show yet: generate, or load a trace._"
    number = step.step if number is None else number
    of = f" of {total_steps}" if total_steps else ""
    _, bonus = split_step_text(step)
    bonus_part = (f" + the target's bonus token **`{show_token(bonus, escape=False)}`**"
                  if len(step.new_tokens) > len(step.accepted) else " (the answer ended here, no bonus token)")
    if step.prefill:
        return (f"**Prefill** (step 0, before the {total_steps or ''} decoding steps) — the prompt is read.\n\n"
                f"1. **Read the prompt**: one target forward over every prompt token fills the KV cache "
                f"({step.verify_ms:.1f} ms).\n"
                f"2. **First token**: its last row gives the answer's first token "
                f"**`{show_token(step.text, escape=False)}`**; from step 1 on, the head drafts from it."
                + (f"\n3. **The head reads the prompt**: the target's feature at each prompt token, paired "
                   f"with the next token, through the EAGLE head's layer, which fills its own cache "
                   f"({step.draft_ms:.1f} ms)." if step.draft_ms > 0 else ""))   # only the head drafts in a prefill
    if step.tree is None or not len(step.tree):
        return (f"**Step {number}{of}** — no draft tree.\n\n"
                f"1. **Draft**: nothing drafted ({'vanilla decoding' if step.method == 'vanilla' else 'no draft this step'}).\n"
                f"2. **Verify**: one target forward over 1 token ({step.verify_ms:.1f} ms).\n"
                f"3. **Accept**: the target's own next token **`{show_token(step.text, escape=False)}`**.")
    tree = step.tree
    accepted_ids = sorted((i for i, s in enumerate(tree.status) if s == "accepted"), key=lambda i: tree.depths[i])
    # the tokens kept are the step's own count (``step.accepted``); a path the target agreed with
    # beyond the answer's end (EOS, the token budget) is not counted, and said so
    kept = len(step.accepted)
    tokens = ", ".join(f"`{show_token(tree.texts[i], escape=False)}`" for i in accepted_ids[:kept]) or "none"
    beyond = len(accepted_ids) - kept
    if beyond > 0:
        tokens += f"; {beyond} more matched after the answer's end, not kept"
    rejected = tree.status.count("rejected")
    unreached = tree.status.count("unreached")
    change = tree_change(step, previous, why)
    shape = f", tree {tree_shape(step.tree_config)}" if step.tree_config else ""
    return (f"**Step {number}{of}** ({step.method}{shape})\n\n" + (f"{change}\n\n" if change else "") +
            draft_account(step) +
            f"2. **Verify**: **one target forward over {len(tree) + 1} tokens** — the root plus every node, "
            f"each seeing only its own ancestors through the tree attention mask ({step.verify_ms:.1f} ms).\n"
            f"3. **Accept**: **{len(step.accepted)} draft token{'s' if len(step.accepted) != 1 else ''}** "
            f"({tokens}){bonus_part}. {rejected} node{'s' if rejected != 1 else ''} rejected, "
            f"{unreached} never reached.\n\n"
            f"Net: **{len(step.new_tokens)} token{'s' if len(step.new_tokens) != 1 else ''} for one target forward**."
            + (f"\n\n{why_text}" if (why_text := acceptance_rule(step)) else ""))
