"""Plain words for the page's few technical terms: each is shown once with a one-line
explanation on hover (an ``<abbr title=…>``, which Gradio's Markdown keeps), where it first
appears on the stage."""
from __future__ import annotations

import html

GLOSSARY = {
    "τ": "tau: the tokens one target forward writes on average (accepted guesses + 1 bonus); plain decoding has τ = 1",
    "q": "q: the draft head's probability of this token at its branch: how sure the head was",
    "p": "p: the target model's own probability of this token at that point",
    "target forward": "one pass of the big (target) model; plain decoding needs one per token, "
                      "EAGLE checks a whole tree of guesses in one",
    "bonus token": "the target's own next token after the accepted guesses: every verify pass yields it for free",
    "␣": "a visible space: the token starts with a space",
}


def term(word: str, shown: str | None = None) -> str:
    """``word`` (or ``shown``) with its glossary line on hover."""
    return f'<abbr class="lens-term" title="{html.escape(GLOSSARY[word])}">{html.escape(shown or word)}</abbr>'
