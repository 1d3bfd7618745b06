"""A plain-words account of one step's three phases: draft, verify, accept."""
from __future__ import annotations

from app.engine.events import StepEvent
from app.viz.stream import split_step_text
from app.viz.tree import show_token


def phase_account(step: StepEvent | None, total_steps: int | None = None) -> str:
    """Markdown: what the draft head proposed, what the one target forward checked, and what
    was kept. Token texts are escaped (they may come from a stranger's trace)."""
    if step is None:
        return "_No step to show yet: generate, or load a trace._"
    of = f" of {total_steps}" if total_steps else ""
    _, bonus = split_step_text(step)
    bonus_part = (f" + the target's bonus token **`{show_token(bonus, escape=False)}`**"
                  if len(step.new_tokens) > len(step.accepted) else " (the answer ended here, no bonus token)")
    if step.tree is None or not len(step.tree):
        return (f"**Step {step.step}{of}** — no draft tree.\n\n"
                f"1. **Draft**: nothing drafted ({'vanilla decoding' if step.method == 'vanilla' else 'no draft this step'}).\n"
                f"2. **Verify**: one target forward over 1 token ({step.verify_ms:.1f} ms).\n"
                f"3. **Accept**: the target's own next token **`{show_token(step.text, escape=False)}`**.")
    tree = step.tree
    levels = max(tree.depths)
    accepted_ids = sorted((i for i, s in enumerate(tree.status) if s == "accepted"), key=lambda i: tree.depths[i])
    tokens = ", ".join(f"`{show_token(tree.texts[i], escape=False)}`" for i in accepted_ids) or "none"
    rejected = tree.status.count("rejected")
    unreached = tree.status.count("unreached")
    return (f"**Step {step.step}{of}** ({step.method})\n\n"
            f"1. **Draft**: the head proposed **{len(tree)} nodes in {levels} level{'s' if levels != 1 else ''}** "
            f"({levels} small head forwards, {step.draft_ms:.1f} ms).\n"
            f"2. **Verify**: **one target forward over {len(tree) + 1} tokens** — the root plus every node, "
            f"each seeing only its own ancestors through the tree attention mask ({step.verify_ms:.1f} ms).\n"
            f"3. **Accept**: **{len(step.accepted)} draft token{'s' if len(step.accepted) != 1 else ''}** "
            f"({tokens}){bonus_part}. {rejected} node{'s' if rejected != 1 else ''} rejected, "
            f"{unreached} never reached.\n\n"
            f"Net: **{len(step.new_tokens)} token{'s' if len(step.new_tokens) != 1 else ''} for one target forward**.")
