"""EAGLE-3's draft head on the fast kernels (``rowwise.RowwiseEagle3Head``): one C call per
level computes exactly its per-kernel reference, both compute what the eager head computes,
and an engine that drafts with it stays lossless (on the tiny 8-layer target of tests/tiny.py;
the head reads the inputs of layers 2, 4, 5). That its int8 weights accept about what its
own accept, on the shipped head: tests/test_rowwise.py."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from app.engine import kernels, kv, rowwise
from app.engine.config import SamplingConfig, TreeConfig
from app.engine.engine import Engine
from app.engine.rowwise import RowwiseDraftHead, RowwiseEagle3Head
from tests.tiny import eagle3_target, random_eagle3_head, random_head, trained_eagle3_head

pytestmark = pytest.mark.skipif(kernels.load() is None, reason=f"fast kernels unavailable: {kernels.why_not()}")

PROMPT = [5, 17, 33, 90, 4]


@pytest.fixture(scope="module")
def target():
    return eagle3_target(0)


def head_with_distinct_norms(target, seed: int = 0):
    """A random EAGLE-3 head whose RMSNorm weights differ from one another (a fresh head's are
    all ones, which would hide a norm applied to the wrong input)."""
    head = random_eagle3_head(target, seed)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
    return head


def levels(H: int):
    """(rows, feature width) of successive forwards: the pending pairs read the target's
    three taps (3H), the tree levels after them the head's own state (H)."""
    return ((5, 3 * H), (1, 3 * H), (3, H), (2, H))


def inputs(g, T, width, H, length):
    emb, feat = torch.randn(1, T, H, generator=g), torch.randn(1, T, width, generator=g)
    pos = torch.arange(length, length + T)[None]
    mask = torch.ones(T, length + T, dtype=torch.bool).tril(length)
    mask[-1, 0] = False                                                   # a row that may not see key 0
    return emb, feat, pos, mask[None, None]


@pytest.mark.parametrize("dtype,int8", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_the_eagle3_layer_in_one_call_is_its_per_kernel_forward_bit_for_bit(target, dtype, int8):
    """``kernels.decoder_eagle3`` runs the per-kernel path's steps in C: [norm(emb); norm(g)]
    into q, k, v, g as the residual. Over 3H-wide pending pairs and H-wide tree levels, the
    outputs, the logits and the keys and values cached are the per-kernel path's, bit for bit."""
    head = head_with_distinct_norms(target).to(dtype)
    draft = RowwiseEagle3Head(head, int8)
    assert RowwiseEagle3Head.supports(head) and not RowwiseDraftHead.supports(head) and draft.one_call
    assert draft.qkv.in_features == 2 * draft.hidden_size and draft.fc.in_features == 3 * draft.hidden_size
    H = draft.hidden_size
    g = torch.Generator().manual_seed(0)
    caches = (kv.preallocated_cache(None, 4), kv.preallocated_cache(None, 4))    # capacity 4: they grow
    length = 0
    with torch.inference_mode():
        for T, width in levels(H):
            emb, feat, pos, mask = inputs(g, T, width, H, length)
            one_call = draft(emb, feat, pos, mask, caches[0])
            x, e = draft._layer_input(emb, feat)
            cos, sin = draft.rope(pos)
            per_kernel = draft._forward_per_kernel(x, cos, sin, T, draft.head_dim, mask, caches[1], e)
            length += T
            assert torch.equal(one_call, per_kernel), (one_call - per_kernel).abs().max()
            assert torch.equal(draft.logits(one_call[0]), draft.logits(per_kernel[0]))
            a, b = caches[0].layers[0], caches[1].layers[0]
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and a.length == length


def test_a_build_without_the_eagle3_layer_takes_the_per_kernel_path(target, monkeypatch):
    """A build of an older source (no ``rowwise_decoder_eagle3``) must not be handed the
    EAGLE-3 layer: the head then runs kernel by kernel, to the same bits."""
    head = head_with_distinct_norms(target)
    fast = RowwiseEagle3Head(head)
    monkeypatch.setattr(kernels, "has_eagle3_layer", lambda: False)
    slow = RowwiseEagle3Head(head)
    assert fast.one_call and not slow.one_call
    H = fast.hidden_size
    g = torch.Generator().manual_seed(2)
    caches = (kv.preallocated_cache(None, 16), kv.preallocated_cache(None, 16))
    length = 0
    with torch.inference_mode():
        for T, width in levels(H):
            emb, feat, pos, mask = inputs(g, T, width, H, length)
            length += T
            assert torch.equal(fast(emb, feat, pos, mask, caches[0]), slow(emb, feat, pos, mask, caches[1]))


@pytest.mark.parametrize("int8,tol", [(False, 1e-5), (True, 0.03)])
def test_the_fast_eagle3_head_computes_what_the_eager_head_computes(target, int8, tol):
    """The same forward as ``Eagle3Head`` (transformers' attention, its own RMSNorms): its
    float32 weights agree to rounding, its int8 weights to their quantization (a wrong norm,
    residual or half of the 2H input would be off by the values' own size), and the int8
    logits' best draft token is the eager head's almost everywhere."""
    head = head_with_distinct_norms(target)
    draft = RowwiseEagle3Head(head, int8)
    H = draft.hidden_size
    g = torch.Generator().manual_seed(1)
    cache, reference_cache = kv.preallocated_cache(None, 16), DynamicCache()
    length, same_best, rows = 0, 0, 0
    with torch.inference_mode():
        for T, width in levels(H):
            emb, feat, pos, mask = inputs(g, T, width, H, length)
            ours, theirs = draft(emb, feat, pos, mask, cache), head(emb, feat, pos, mask, reference_cache)
            length += T
            scale = theirs.abs().max()
            assert (ours - theirs).abs().max() <= tol * scale, ((ours - theirs).abs().max(), scale)
            logits, reference = draft.logits(ours[0]), head.logits(theirs[0])
            assert (logits - reference).abs().max() <= tol * reference.abs().max()
            same_best += int((logits.argmax(-1) == reference.argmax(-1)).sum())
            rows += T
    assert same_best >= 0.9 * rows, (same_best, rows)


@pytest.mark.parametrize("weights", ["int8", "head"])
def test_an_engine_drafting_eagle3_on_the_fast_kernels_is_greedy_identical_to_vanilla(target, weights):
    """The engine picks the fast EAGLE-3 head where the target runs on the kernels; greedy
    decoding with every tree policy gives vanilla's tokens, and the trees are drafted over the
    head's own vocabulary."""
    head = trained_eagle3_head(target)
    engine = Engine(target, head, draft_weights=weights)
    assert isinstance(engine.decoder, rowwise.RowwiseLlamaDecoder)
    assert isinstance(engine.draft_model.forward, RowwiseEagle3Head) and engine.draft_model.weights == weights
    vocab = set(head.draft_token_ids().tolist())
    greedy = SamplingConfig(temperature=0.0)
    *_, vanilla = engine.generate(prompt_ids=PROMPT, tree=TreeConfig(method="vanilla"), sampling=greedy,
                                  max_new_tokens=40)
    accepted = 0
    for tree in (TreeConfig(total_tokens=12, depth=4, top_k=4), TreeConfig(method="chain", depth=4),
                 TreeConfig(method="static", depth=3, top_k=3)):
        *steps, summary = engine.generate(prompt_ids=PROMPT, tree=tree, sampling=greedy, max_new_tokens=40)
        assert summary.token_ids == vanilla.token_ids, tree.shape()
        drafted = [t for s in steps[1:] for t in s.tree.tokens]
        assert drafted and set(drafted) <= vocab and {s.drafter for s in steps[1:]} == {"eagle3"}
        accepted += sum(len(s.accepted) for s in steps)
    assert accepted > 0                                   # the trained head's drafts are accepted


def test_an_eagle1_head_still_drafts_on_its_own_fast_head(target):
    engine = Engine(target, random_head(target))
    assert type(engine.draft_model.forward) is RowwiseDraftHead
