"""Prompts the target writes itself (Magpie: Xu et al., 2024, "Alignment Data Synthesis from
Scratch by Prompting Aligned LLMs with Nothing").

Why: the template prompts of ``prompts.py`` are varied in topic but not in form, and a head
trained on their answers accepts less on real users' turns: on the evaluation suites' own
greedy answers the shipped EAGLE-3 head's depth-1 acceptance is 0.53-0.71 against 0.73 on a
held-out template shard (``scripts/heldout_acceptance.py --suite all``). An instruct model has
seen many real user turns in its own tuning, and it gives them back when asked for one: fed
the chat template up to the start of a user turn and nothing else, it samples a plausible
user request and ends it with its end-of-turn token. Offline, no dataset needed, and the
prompts come from the same model whose answers the head learns.

What is kept: turns the model ended itself (an end-of-turn token within ``max_new_tokens``),
of at least ``MIN_WORDS`` words, not a (normalised) duplicate of one already kept, and not an
exact or near duplicate of any evaluation turn (``eval_overlap.EvalIndex``, as for the
template prompts).
"""
from __future__ import annotations

from typing import Callable

import torch

from app.train.eval_overlap import EvalIndex, normalise
from app.train.prompts import Prompt

MIN_WORDS = 4
CATEGORY = "magpie"


def user_turn_prefix(tokenizer) -> list[int]:
    """The token ids of the chat template up to where a user turn's text starts (the default
    system turn included, as every prompt the engine encodes has it)."""
    marker = "\u2063MAGPIE\u2063"                                   # a text no template contains
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return tokenizer(text[:text.index(marker)], add_special_tokens=False)["input_ids"]


def magpie_prompts(model, tokenizer, n: int, eos_ids: set[int], *, seed: int = 0, first_id: int = 0,
                   batch_size: int = 64, max_new_tokens: int = 96, temperature: float = 1.0,
                   eval_index: EvalIndex | None = None, seen: set[str] | None = None,
                   on_batch: Callable[[list[Prompt]], None] | None = None) -> list[Prompt]:
    """``n`` user turns sampled from ``model`` after the template's user prefix, ids
    ``p{first_id:06d}`` on. Each batch's seed follows from ``seed`` and the id of its first
    prompt (``first_id`` + the number kept so far), so a run cut short, saved batch by batch
    (``on_batch`` sees each batch's keepers) and started again from what it kept continues the
    same sequence. ``seen``: normalised texts already in the prompt set (not repeated)."""
    prefix = torch.tensor(user_turn_prefix(tokenizer))             # (P,)
    device = model.get_output_embeddings().weight.device
    seen = set() if seen is None else set(seen)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out: list[Prompt] = []
    empty = 0                                                      # batches in a row that kept nothing
    while len(out) < n:
        if empty == 3:
            raise RuntimeError(f"3 batches of {batch_size} kept no user turn ({len(out)} of {n} kept): "
                               "does this model end a user turn with one of its EOS tokens?")
        torch.manual_seed((seed * 1_000_003 + first_id + len(out)) * 8 + empty)   # generate samples from the global RNG
        ids = prefix.repeat(batch_size, 1).to(device)             # (B, P)
        sampled = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
                                 temperature=temperature, max_new_tokens=max_new_tokens,
                                 eos_token_id=sorted(eos_ids), pad_token_id=pad)[:, ids.shape[1]:].cpu()
        kept: list[Prompt] = []
        for row in sampled.tolist():
            ends = [i for i, t in enumerate(row) if t in eos_ids]
            if not ends:                                           # cut off: not a whole turn
                continue
            text = tokenizer.decode(row[:ends[0]], skip_special_tokens=True).strip()
            key = normalise(text)
            if len(text.split()) < MIN_WORDS or key in seen or (eval_index is not None and eval_index.overlaps(text)):
                continue
            seen.add(key)
            kept.append(Prompt(id=f"p{first_id + len(out) + len(kept):06d}", category=CATEGORY, text=text))
            if len(out) + len(kept) == n:
                break
        out += kept
        empty = 0 if kept else empty + 1
        if on_batch is not None:
            on_batch(kept)
    return out
