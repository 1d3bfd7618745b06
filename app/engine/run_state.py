"""The records of one generation's state, which the engine's verbs pass between them.

``_Run`` is everything one generation owns from its prefill to its end (the committed
tokens, the target's and the head's KV caches, the head's pending pairs, the seeded
generator, a drafter's per-run state): kept here, never on the model, so runs cannot leak
into each other. ``_Verified`` is what one verify forward hands to accept, commit and record
(and to a drafter's ``observe``). ``PhaseClock`` times a step's phases. Plain records with no
model work, apart from the loop in ``engine.py`` so that both it and the EAGLE head's drafting
(``head_draft.py``) can read them without importing each other. The leading underscore says
they are the engine package's own, not an API.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from app.engine import verify


@dataclass
class _Run:
    """Everything one generation owns (never stored on the model, so runs cannot leak)."""

    tokens: list[int]                  # committed sequence x: prompt + generated
    target_cache: object               # transformers DynamicCache over x[:-1] (kv.PreallocatedLayer buffers)
    draft_cache: object | None         # the head's cache (same kind), or None for vanilla
    pending_features: torch.Tensor | None  # (1, P, H) features f[j] of pairs not yet read by the head
                                           # (EAGLE-3: (1, P, 3H), the target's low/mid/high layers)
    pending_tokens: list[int]          # the P tokens x[j+1] of those pairs
    generator: torch.Generator
    stream: TextStream | None = None   # the generated text, decoded step by step (set by the prefill)
    drafter: object | None = None      # pld / lookahead / medusa: their per-run state (app/engine/drafters)
    lookup: object | None = None       # the n-gram index of ``tokens`` for TreeConfig.lookup (drafters.pld.NgramIndex)


class TextStream:
    """The generated text, one step's new part at a time, decoding only the answer's last
    few tokens.

    Decoding the whole answer at every step costs O(length) a step (~0.05 ms at 128 tokens
    with SmolLM2's tokenizer, ~0.5 ms at 1,000). Here a step decodes the tokens since
    ``start`` (those of the step before, and its own) twice, with and without its own, and
    emits what they add. A text that ends inside a character (a multi-byte character split
    across tokens decodes to U+FFFD) is held back until the character is whole, or until the
    answer ends (``final``); decoding from an earlier step's end also keeps a tokenizer that
    drops a leading space from dropping one mid-answer. The steps' texts add up to the
    decode of the whole answer."""

    def __init__(self, decode):
        self.decode = decode               # ids -> text (skipping special tokens)
        self.ids: list[int] = []
        self.start = 0                     # decode windows begin here: the end of the text emitted before last
        self.done = 0                      # the text of ids[:done] has been emitted
        self.text = ""                     # all of it

    def push(self, ids: list[int], final: bool = False) -> str:
        """Append a step's tokens; returns the text they complete."""
        self.ids.extend(ids)
        before = self.decode(self.ids[self.start:self.done])
        after = self.decode(self.ids[self.start:])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        new = after[len(before):]
        self.start, self.done = self.done, len(self.ids)
        self.text += new
        return new


@dataclass
class _Verified:
    """What one verify forward produced: rows are [root, node 0, ..., node N-1]."""

    prefix: int                        # committed tokens before the root (= target cache length)
    root: int
    hidden: torch.Tensor               # (1, N+1, H) the target's features at every row, as the
                                       # forward returned them (float32 on the fast forward)
    draft_features: torch.Tensor       # (1, N+1, H or 3H) what the head reads of each row: hidden, or
                                       # EAGLE-3's low/mid/high layers from the same forward (as returned)
    lm_rows: list[int]                 # rows whose logits were computed in one batch
    batch: torch.Tensor                # (len(lm_rows), V) their logits
    logits: verify.LazyRows            # logits[row] (V,), the rest computed on demand


class PhaseClock:
    """Milliseconds between laps, with the device synchronised so that a lap covers work that
    has finished (CUDA runs asynchronously; on a CPU ``sync`` does nothing)."""

    def __init__(self, device: torch.device):
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.start = self._last = time.perf_counter()
        self.ms: dict[str, float] = {}

    def lap(self, name: str) -> None:
        self._sync()
        now = time.perf_counter()
        self.ms[name] = (now - self._last) * 1e3
        self._last = now

    @property
    def total_ms(self) -> float:
        return (self._last - self.start) * 1e3
