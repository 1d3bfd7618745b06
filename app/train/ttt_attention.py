"""The training-time test's attention, computed from its structure instead of a dense mask.

At TTT step s the head's query at position j may see the step-0 keys at positions <= j and,
for 1 <= t <= s, the single step-t key at j itself (``app.train.eagle3.ttt_step_mask``).
Given that mask as a dense (L, (s+1)·L) bool tensor, SDPA's CPU kernel scores every query
against all (s+1)·L keys and reads the mask for each: at step 2 three times the work of the
L·L/2 scores that count, and the slowest op of a step after the matmuls
(benchmarks/eagle3-training.md). Here the step-0 part is one causal score matrix and
each later step adds one score per query, a row-wise dot product; a softmax over the L + s
columns joins them. The result is the same attention (tests/test_ttt_attention.py compares
it with SDPA under the dense mask, values and gradients).

Registered with transformers' ``AttentionInterface`` as ``"eagle3_ttt"``; ``structured``
switches a head to it for the duration of a training-time-test unroll.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AttentionInterface

NAME = "eagle3_ttt"


def ttt_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """transformers' attention-function signature; returns ((B, L, h, D) output, None).

    ``query`` (B, h, L, D); ``key``/``value`` (B, kv, (s+1)·L, D): the keys of steps 0..s in
    order, as the unroll's cache holds them. ``attention_mask`` is ignored: the structure is
    the mask (only ``structured`` selects this function, and only for the unroll)."""
    B, h, L, D = query.shape
    kv = key.shape[1]
    steps = key.shape[2] // L                       # s + 1
    if key.shape[2] != steps * L:
        raise ValueError(f"TTT attention expects (s+1)·L keys for L = {L} queries, got {key.shape[2]}")
    g = h // kv                                    # query heads per key/value head (GQA)
    q = query.reshape(B, kv, g, L, D)              # (B, kv, g, L, D) without copying K/V per head
    k = key.reshape(B, kv, steps, L, D)            # (B, kv, s+1, L, D)
    v = value.reshape(B, kv, steps, L, D)
    causal = torch.ones(L, L, dtype=torch.bool, device=query.device).triu(1)      # (L, L) True = hidden
    # (B, kv, g·L, L) the step-0 scores, then each later step's one score per query (B, kv, g, L, s)
    scores0 = torch.matmul(q.reshape(B, kv, g * L, D), k[:, :, 0].transpose(-1, -2)).view(B, kv, g, L, L)
    scores0 = (scores0 * scaling).masked_fill(causal, float("-inf"))
    later = (q.unsqueeze(4) * k[:, :, None, 1:].transpose(3, 4)).sum(-1) * scaling if steps > 1 else None
    scores = scores0 if later is None else torch.cat((scores0, later.to(scores0.dtype)), -1)  # (B, kv, g, L, L+s)
    # softmax in at least fp32 (as the eager attention does for bf16 queries)
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(query.dtype)
    out = torch.matmul(probs[..., :L].reshape(B, kv, g * L, L), v[:, :, 0]).view(B, kv, g, L, D)
    if steps > 1:   # (B, kv, g, L, s, 1) weights times (B, kv, 1, L, s, D) step-t values at j
        out = out + (probs[..., L:].unsqueeze(-1) * v[:, :, None, 1:].transpose(3, 4)).sum(4)
    return out.reshape(B, h, L, D).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, ttt_attention)


@contextmanager
def structured(head):
    """Run ``head``'s attention as ``ttt_attention`` inside the block (then restore it)."""
    config = head.midlayer.self_attn.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield head
    finally:
        config._attn_implementation = before
