"""Long prompts: a task over a document of a few hundred to a thousand tokens, the document
made of the target's own earlier answers.

Why: every training conversation had been at most 639 tokens (median 291), and on the sum
suite, whose articles run 419-1,157 tokens, both heads accept ~0.35 at depth 1 against
0.60-0.70 on the other suites (``scripts/heldout_acceptance.py --suite all``; numbers in
benchmarks/eagle3-data-variety.md). A head that never saw a long context learns neither to
read its features there nor to follow an answer that copies from far back.

Where the documents come from: the responses already kept as token ids
(``token_store``, committed with the head), decoded. A document is 2-8 whole answers that
ended with an end-of-sequence token, picked at random and joined by blank lines until it
holds ``min_tokens``-``max_tokens`` tokens. No model runs here (the answers to these prompts
come from the data stage, as for every prompt), the selection is seeded per prompt id (a run
cut short continues the same sequence), and the held-out shards' answers are never used (a
held-out answer would otherwise be in a training context, and copying it would be learned).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from app.train.eval_overlap import EvalIndex, normalise
from app.train.data import shard_name
from app.train.prompts import Prompt, draw_int, pick   # the template generators' seeded draws
from app.train.token_store import IdShard, kept_shards

CATEGORY = "documents"
MIN_ANSWER_TOKENS = 40          # shorter answers ("Sure!", one line) make a list, not a document
MAX_PIECES = 8

# The task around a document, in several forms: the sum suite's "Summarize: <article>" is one
# of many ways a user asks about a text, and the head should not learn one frame.
TASKS = (
    "Summarize: {doc}",
    "Summarize the following text in a few sentences.\n\n{doc}",
    "{doc}\n\nWrite a short summary of the text above.",
    "What are the main points of this text?\n\n{doc}",
    "Read the passage below and list its three most important ideas.\n\n{doc}",
    "Give the following text a title, then summarize it in one paragraph.\n\n{doc}",
    "{doc}\n\nIn two sentences, what is this text about?",
    "Turn the text below into a short bulleted summary.\n\n{doc}",
    "Here are some notes I collected:\n\n{doc}\n\nCan you condense them into a brief overview?",
    "{doc}\n\nWhich advice in the text above is the most useful, and why?",
    "Explain the text below to a twelve-year-old in a short paragraph.\n\n{doc}",
    "Write a one-sentence TL;DR for this:\n\n{doc}",
)

_TASK_FORMS = [re.compile(re.escape(t).replace(re.escape("{doc}"), "(.+)"), re.S) for t in TASKS]


def is_document_task(text: str) -> bool:
    """Whether ``text`` is one of ``TASKS`` around some document."""
    return any(form.fullmatch(text) for form in _TASK_FORMS)


def kept_answers(ids_dir: Path, tokenizer, eos_ids: set[int], exclude: set[int] = frozenset()) -> list[tuple[str, int]]:
    """(text, tokens) of every kept response that ended with an end-of-sequence token and has
    at least ``MIN_ANSWER_TOKENS`` tokens, shard by shard in index order, skipping the shard
    indices in ``exclude`` (the held-out ones)."""
    out = []
    for index in kept_shards(ids_dir):
        if index in exclude:
            continue
        ids = IdShard.load(Path(ids_dir) / f"{shard_name(index)}.npz")
        for conv, prompt_len in zip(ids.conversations(), ids.prompt_lens):
            response = conv[int(prompt_len):].astype(np.int64).tolist()
            if not response or response[-1] not in eos_ids or len(response) - 1 < MIN_ANSWER_TOKENS:
                continue
            text = tokenizer.decode(response[:-1], skip_special_tokens=True).strip()
            if text:
                out.append((text, len(response) - 1))
    return out


def document_prompts(answers: list[tuple[str, int]], n: int, *, seed: int = 0, first_id: int = 0,
                     min_tokens: int = 350, max_tokens: int = 1100, eval_index: EvalIndex | None = None,
                     seen: set[str] | None = None) -> list[Prompt]:
    """``n`` prompts, ids ``p{first_id:06d}`` on: a task from ``TASKS`` over a document of
    ``answers`` (their token counts summed, plus a blank line's ~1 token between two, within
    [min_tokens, max_tokens]). Prompt i depends only on ``seed`` and its id, so the first k of
    a run of n are a run of k. A draw that lands outside the window, repeats a kept prompt
    or overlaps an evaluation turn is drawn again."""
    if not answers:
        raise ValueError("no kept answers to build documents from (are the token ids kept? --ids-dir)")
    if sum(t for _, t in sorted(answers, key=lambda a: -a[1])[:MAX_PIECES]) < min_tokens:
        raise ValueError(f"the kept answers are too short for a document of {min_tokens} tokens")
    seen = set() if seen is None else set(seen)
    out: list[Prompt] = []
    for i in range(first_id, first_id + n):
        g = torch.Generator().manual_seed(seed * 1_000_003 + i)
        for _ in range(100):
            target = draw_int(min_tokens, max_tokens, g)
            pieces, tokens, draws = [], 0, 0
            while tokens < target and len(pieces) < MAX_PIECES and draws < 4 * MAX_PIECES:
                draws += 1
                text, count = pick(answers, g)
                added = count + (1 if pieces else 0)             # the blank line between two pieces
                if tokens + added > max_tokens:
                    continue                                     # does not fit: draw another
                pieces.append(text)
                tokens += added
            if not min_tokens <= tokens <= max_tokens:
                continue
            task = pick(TASKS, g)
            prompt = task.format(doc="\n\n".join(pieces))
            key = normalise(prompt)
            if key in seen or (eval_index is not None and eval_index.overlaps(prompt)):
                continue
            seen.add(key)
            out.append(Prompt(id=f"p{i:06d}", category=CATEGORY, text=prompt))
            break
        else:
            raise RuntimeError(f"no document of {min_tokens}-{max_tokens} tokens in 100 draws for prompt p{i:06d}")
    return out
