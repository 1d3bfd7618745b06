"""The training-time test's structured attention is the same attention as SDPA under the dense
``ttt_step_mask``: outputs and gradients, at every unroll step, with grouped-query heads, and
through a whole head unroll."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from app.train import eagle3
from app.train.eagle3 import ttt_step_mask
from app.train.ttt_attention import ttt_attention


def _dense(query, key, value, mask, scaling):
    """SDPA over the (L, (s+1)·L) mask, grouped heads repeated: the reference."""
    g = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(query, key.repeat_interleave(g, 1), value.repeat_interleave(g, 1),
                                         attn_mask=mask, scale=scaling)
    return out.transpose(1, 2)                                               # (B, L, h, D)


@pytest.mark.parametrize("step", [0, 1, 2, 3])
def test_structured_attention_matches_sdpa_under_the_dense_mask(step):
    B, h, kv, L, D = 2, 4, 2, 9, 8                                            # two query heads per KV head
    gen = torch.Generator().manual_seed(step)
    query = torch.randn(B, h, L, D, generator=gen, dtype=torch.float64, requires_grad=True)
    key = torch.randn(B, kv, (step + 1) * L, D, generator=gen, dtype=torch.float64, requires_grad=True)
    value = torch.randn(B, kv, (step + 1) * L, D, generator=gen, dtype=torch.float64, requires_grad=True)
    scaling = D ** -0.5
    weights = torch.randn(B, L, h, D, generator=gen, dtype=torch.float64)   # a loss that reads every output

    want = _dense(query, key, value, ttt_step_mask(step, L), scaling)
    want_grads = torch.autograd.grad((want * weights).sum(), (query, key, value))
    got, _ = ttt_attention(None, query, key, value, None, scaling)
    got_grads = torch.autograd.grad((got * weights).sum(), (query, key, value))

    assert got.shape == (B, L, h, D)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_keys_that_are_not_whole_steps_are_refused():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"\(s\+1\)"):
        ttt_attention(None, q, torch.zeros(1, 2, 6, 8), torch.zeros(1, 2, 6, 8), None, 1.0)


def test_a_head_unrolled_with_it_equals_the_head_unrolled_with_sdpa(monkeypatch):
    """The whole unroll (cache, positions, GQA of the real head config) with and without
    ``structured``: the same states at every step."""
    from tests.tiny import eagle3_target

    target = eagle3_target(0)
    head = eagle3.new_head(target, torch.arange(64), (2, 4, 5)).double()
    H = target.model.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    embeds = torch.randn(2, 11, H, generator=gen, dtype=torch.float64)
    layers = torch.randn(2, 11, 3 * H, generator=gen, dtype=torch.float64)
    structured_states = list(eagle3.ttt_forward(head, embeds, layers, 3))
    monkeypatch.setattr(eagle3, "structured", lambda head: contextlib.nullcontext(head))
    assert head.midlayer.self_attn.config._attn_implementation != "eagle3_ttt"   # restored after each step
    dense_states = list(eagle3.ttt_forward(head, embeds, layers, 3))
    for s, (a, b) in enumerate(zip(structured_states, dense_states)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"step {s}")
