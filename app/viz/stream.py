"""The answer as HTML, every token marked by where it came from.

Each step (one target forward) becomes one ``<span class="step">`` whose tooltip names the
step; inside it, the accepted draft tokens (class ``draft``) and the target's bonus token
(class ``bonus``). Vanilla steps hold a single target token. The split comes from the records
themselves — the accepted nodes' texts — never from diffing strings of two runs.
"""
from __future__ import annotations

import html

from app.engine.events import StepEvent


def split_step_text(step: StepEvent) -> tuple[str, str]:
    """(text of the accepted draft tokens, text of the bonus token) for one step.

    The accepted nodes' texts were decoded one token at a time. We walk through the step's
    text consuming their characters in order; some tokenizers join tokens with spaces that a
    lone token's text lacks, so extra whitespace in the step's text is skipped. Where the walk
    ends, the bonus token begins. If the texts do not line up (a character split across two
    tokens, say) the whole step is shown as one bonus-coloured run rather than guessing.
    """
    if step.tree is None or not step.accepted:
        return "", step.text
    tree = step.tree
    path = sorted((i for i, s in enumerate(tree.status) if s == "accepted"), key=lambda i: tree.depths[i])
    drafted = "".join(tree.texts[i] for i in path[: len(step.accepted)])
    text, pos = step.text, 0
    for ch in drafted:
        while pos < len(text) and text[pos] != ch and text[pos].isspace():
            pos += 1
        if pos >= len(text) or text[pos] != ch:
            return "", text
        pos += 1
    if len(step.new_tokens) == len(step.accepted):   # no bonus token this step (EOS / budget)
        return text, ""
    return text[:pos], text[pos:]


def _span(cls: str, text: str, tip: str) -> str:
    return f'<span class="tok {cls}" title="{tip}">{html.escape(text)}</span>' if text else ""


def stream_html(steps: list[StepEvent], upto: int | None = None, highlight: int | None = None,
                note: str = "") -> str:
    """The token stream of ``steps[:upto + 1]`` (all when ``upto`` is None); step ``highlight``
    gets the ``current`` class (the replay slider's step)."""
    shown = steps if upto is None else steps[: upto + 1]
    parts = []
    for s in shown:
        drafted, bonus = split_step_text(s)
        n_draft = len(s.accepted)
        tip_d = f"step {s.step} · accepted draft token{'s' if n_draft != 1 else ''} ({n_draft})"
        tip_b = f"step {s.step} · the target's bonus token"
        cls = "step current" if s.step == highlight else "step"
        parts.append(f'<span class="{cls}" data-step="{s.step}" title="step {s.step}">'
                     f'{_span("draft", drafted, tip_d)}{_span("bonus", bonus, tip_b)}</span>')
    body = "".join(parts) or '<span class="placeholder">the answer will stream here</span>'
    tail = f'<div class="stream-note">{html.escape(note)}</div>' if note else ""
    return f'<div class="token-stream-body">{body}</div>{tail}'
