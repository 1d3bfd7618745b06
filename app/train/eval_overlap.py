"""Decontamination: whether a training prompt overlaps an evaluation set.

A head trained on prompts that appear in an evaluation set would score acceptance on its own
training data. ``EvalIndex`` indexes every turn of every set in ``data/eval`` (copied from
shared/data/eval) by normalised word trigrams, and ``prompts.build_prompts`` drops any prompt
that is an exact or near duplicate of one (trigram Jaccard or containment); a test checks the
built set again. Kept apart from the prompt generators because it is about the evaluation
sets, not the prompts: ``app/train/evaluate.py`` reads the same ``EVAL_DIR``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from app.engine.loading import REPO_ROOT


EVAL_DIR = REPO_ROOT / "data" / "eval"   # the evaluation sets, copied into the repo with attribution


def normalise(text: str) -> str:
    """Lower-case words and digits only, single spaces: what near-duplicate checks compare."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def ngrams(text: str, n: int = 3) -> set[tuple[str, ...]]:
    words = normalise(text).split()
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def eval_questions(eval_dir: Path = EVAL_DIR) -> list[str]:
    """Every turn of every evaluation set (not only first turns: none may be trained on)."""
    out = []
    for path in sorted(Path(eval_dir).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.extend(json.loads(line)["turns"])
    if not out:
        raise FileNotFoundError(f"no evaluation questions found in {eval_dir}")
    return out


class EvalIndex:
    """Word-trigram index of the eval questions for fast near-duplicate tests.

    A prompt overlaps a question when their normalised texts are equal, or their trigram
    Jaccard similarity is >= ``jaccard``, or >= ``containment`` of the question's trigrams
    appear in the prompt (catches a short eval instruction pasted into a longer prompt).
    """

    def __init__(self, questions: list[str], n: int = 3, jaccard: float = 0.5, containment: float = 0.8):
        self.n, self.jaccard, self.containment = n, jaccard, containment
        self.exact = {normalise(q) for q in questions}
        self.grams = [ngrams(q, n) for q in questions]
        self.by_gram: dict[tuple[str, ...], list[int]] = {}
        for i, gs in enumerate(self.grams):
            for gram in gs:
                self.by_gram.setdefault(gram, []).append(i)

    @classmethod
    def from_dir(cls, eval_dir: Path = EVAL_DIR, **kw) -> "EvalIndex":
        return cls(eval_questions(eval_dir), **kw)

    def closest(self, text: str) -> tuple[float, float]:
        """(max Jaccard, max containment) of ``text`` against all questions."""
        grams = ngrams(text, self.n)
        shared: dict[int, int] = {}
        for gram in grams:
            for i in self.by_gram.get(gram, ()):
                shared[i] = shared.get(i, 0) + 1
        best_j = best_c = 0.0
        for i, k in shared.items():
            q = self.grams[i]
            best_j = max(best_j, k / len(grams | q))
            if len(q) >= 4:  # containment is meaningless for one- or two-trigram questions
                best_c = max(best_c, k / len(q))
        return best_j, best_c

    def overlaps(self, text: str) -> bool:
        if normalise(text) in self.exact:
            return True
        j, c = self.closest(text)
        return j >= self.jaccard or c >= self.containment
