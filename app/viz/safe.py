"""Text from outside the code (a trace someone uploaded, a request, a model's name) made inert
before it is put into Markdown.

Gradio's Markdown renders HTML tags, links and bare URLs: a trace whose ``model.dtype`` reads
``<img src=http://...>`` would otherwise make every browser that shows it fetch that address,
and ``[text](http://...)`` would show a link of the uploader's choosing. Inside a Markdown
code span nothing is interpreted — no tag, link, autolink, emphasis or LaTeX — so such text is
shown there, verbatim.
"""
from __future__ import annotations

import html
import re

_BACKTICKS = re.compile(r"`+")


def md_code(text, limit: int = 200) -> str:
    """``text`` as one Markdown code span (newlines become spaces; at most ``limit`` chars).
    The fence is one backtick longer than the longest run of backticks inside, as CommonMark
    requires, so no text can close it early."""
    text = " ".join(str(text).split())[:limit]
    if not text:
        return "` `"
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def page_message(text) -> str:
    """A message for Gradio's toast (``gr.Error``), which renders HTML: a refused trace's message
    quotes the trace's stray field names. ``<``, ``>`` and ``&`` become entities, so the text
    shows as written. (A validation note under a control is left as is: it quotes only the
    visitor's own request, back to that visitor.)"""
    return html.escape(str(text), quote=False)
