"""One target forward over a tree with a 4D mask equals separate forwards of each branch,
and after commit the kept KV cache equals a fresh forward over the accepted sequence.
Guarded on a tiny Llama and on the embedded SmolLM2 (stock transformers, SDPA)."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from app.engine import kernels, kv, rowwise
from app.engine.config import SamplingConfig, TreeConfig
from app.engine.engine import Engine
from app.engine.tree import tree_attention_mask

PARENTS = [-1, -1, 0, 0, 2, 1, 4]          # a branchy tree of 7 nodes


def tree_forward(target, prefix_ids, root, tokens, parents, cache=None):
    """Logits (N+1, V) of [root, nodes] from one masked forward on top of a prefix cache."""
    model = target.model
    cache = DynamicCache(config=model.config) if cache is None else cache
    with torch.no_grad():
        model.model(input_ids=torch.tensor([prefix_ids]), cache=cache, use_cache=True)
        depths = []
        for p in parents:
            depths.append(1 if p == -1 else depths[p] + 1)
        n0 = len(prefix_ids)
        mask = torch.cat([torch.ones(len(tokens) + 1, n0, dtype=torch.bool), tree_attention_mask(parents)], 1)
        pos = torch.tensor([[n0] + [n0 + d for d in depths]])
        h = model.model(input_ids=torch.tensor([[root] + tokens]), attention_mask=mask[None, None],
                        position_ids=pos, cache=cache, use_cache=True).last_hidden_state
        return model.lm_head(h[0]), cache


def branch_logits(target, seq):
    with torch.no_grad():
        return target.model(torch.tensor([seq])).logits[0, -1]


def check_tree_forward(target, prefix, root, tokens, atol):
    logits, _ = tree_forward(target, prefix, root, tokens, PARENTS)
    assert torch.allclose(logits[0], branch_logits(target, prefix + [root]), atol=atol)
    for i in range(len(tokens)):
        path, node = [], i
        while node != -1:
            path.append(tokens[node])
            node = PARENTS[node]
        seq = prefix + [root] + path[::-1]
        assert torch.allclose(logits[i + 1], branch_logits(target, seq), atol=atol), f"node {i}"


def test_tree_forward_equals_branch_forwards_tiny(tiny):
    target, _ = tiny
    check_tree_forward(target, [5, 6, 7, 8, 9, 10], 11, [20, 21, 22, 23, 24, 25, 26], atol=1e-4)


@pytest.mark.slow
def test_tree_forward_equals_branch_forwards_embedded(embedded_target):
    ids = embedded_target.tokenizer("The quick brown fox jumps over the lazy dog. It")["input_ids"]
    check_tree_forward(embedded_target, ids[:-1], ids[-1], [314, 253, 1029, 2017, 30, 411, 5229], atol=2e-3)


@pytest.mark.parametrize("kind", ["dynamic", "preallocated", "preallocated-growing"])
def test_keep_positions_keeps_root_and_accepted_path(tiny, kind):
    """Gather a non-contiguous path (root, node 1, node 5) out of the tree cache and compare it
    with a fresh forward over prefix + root + those tokens; then a chain commit (a crop) and
    one more token written in place. For transformers' DynamicCache and for the engine's
    buffers (kv.PreallocatedLayer), one of them starting too small so that it has to grow."""
    target, _ = tiny
    model = target.model
    cache = {"dynamic": DynamicCache(config=model.config),
             "preallocated": kv.preallocated_cache(model, 64),
             "preallocated-growing": kv.preallocated_cache(model, 3)}[kind]
    prefix, root, tokens = [5, 6, 7, 8], 11, [20, 21, 22, 23, 24, 25, 26]
    _, cache = tree_forward(target, prefix, root, tokens, PARENTS, cache)
    kv.keep_positions(cache, len(prefix), [0, 2, 6])           # node 1 (parent -1), node 5 (parent 1)

    def check(seq):
        fresh = DynamicCache(config=model.config)
        with torch.no_grad():
            model.model(input_ids=torch.tensor([seq]), cache=fresh, use_cache=True)
        assert kv.cache_length(cache) == len(seq)
        for a, b in zip(cache.layers, fresh.layers):
            assert a.keys.shape == b.keys.shape
            assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)

    check(prefix + [root, 21, 25])
    kv.keep_positions(cache, len(prefix), [0, 1])               # contiguous offsets: a crop
    check(prefix + [root, 21])
    with torch.no_grad():                                       # a write after the crop lands in place
        model.model(input_ids=torch.tensor([[40]]), position_ids=torch.tensor([[len(prefix) + 2]]),
                    cache=cache, use_cache=True)
    check(prefix + [root, 21, 40])


@pytest.mark.skipif(kernels.load() is None, reason=f"fast kernels unavailable: {kernels.why_not()}")
def test_keep_positions_moves_float32_buffers_in_one_c_call_as_torch_would():
    """Where the kernels are loaded, ``kv.keep_positions`` compacts float32 buffers with one C
    call for every layer (``kernels.keep_rows``). It must leave what the torch gather leaves:
    rows before ``start`` untouched, ``start + offsets[j]`` at ``start + j``, every layer's
    length ``start + len(offsets)``; and it must have run (not fallen back to torch)."""
    kernels.load()                         # (another test may have reset the loaded library)
    g = torch.Generator().manual_seed(0)

    def cache_of(data):
        cache = DynamicCache()
        cache.layers = [kv.PreallocatedLayer(16) for _ in data]
        for layer, (keys, values) in zip(cache.layers, data):
            _, key_buffer, value_buffer = layer.reserve(12, 2, 8)       # (1, 2 heads, 16, 8) float32
            key_buffer[:, :, :12], value_buffer[:, :, :12] = keys, values
        return cache

    data = [(torch.randn(1, 2, 12, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g)) for _ in range(3)]
    in_c, in_torch = cache_of(data), cache_of(data)
    start, offsets = 5, [0, 2, 3, 6]
    calls = []
    keep_rows = kernels.keep_rows
    try:
        kernels.keep_rows = lambda *a: calls.append(1) or keep_rows(*a)
        kv.keep_positions(in_c, start, offsets)
    finally:
        kernels.keep_rows = keep_rows
    index = torch.tensor([start + o for o in offsets])
    for layer in in_torch.layers:
        layer.gather_tail(start, index)
    assert calls == [1] and keep_rows([in_c.layers[0].key_buffer], 0, [0]) is True
    for a, b, (keys, _) in zip(in_c.layers, in_torch.layers, data):
        assert a.length == b.length == start + len(offsets)
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert torch.equal(a.keys[:, :, :start], keys[:, :, :start])
        assert torch.equal(a.keys[:, :, start + 1], keys[:, :, start + 2])


@pytest.mark.parametrize("method", ["dynamic", "static", "threshold"])
def test_cache_after_steps_equals_fresh_forward(tiny, method):
    """Run real engine steps; the target cache must equal a fresh forward over x[:-1]."""
    target, head = tiny
    engine = Engine(target, head)
    cfg = TreeConfig(method=method, depth=4, top_k=4, total_tokens=16)
    run, first = engine._prefill([5, 17, 33, 90, 4], cfg, SamplingConfig(), 100, cfg)
    generated = list(first.new_tokens)
    nonfirst = 0
    for i in range(1, 9):
        ev = engine._step(run, cfg, SamplingConfig(), i, 100, generated)
        generated += ev.new_tokens
        nonfirst += any(s == "accepted" and d > 1 for s, d in zip(ev.tree.status, ev.tree.depths))
    assert nonfirst > 0, "some step should accept a path deeper than one node"
    fresh = DynamicCache(config=target.model.config)
    with torch.no_grad():
        target.model.model(input_ids=torch.tensor([run.tokens[:-1]]), cache=fresh, use_cache=True)
    assert kv.cache_length(run.target_cache) == len(run.tokens) - 1
    for a, b in zip(run.target_cache.layers, fresh.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-4) and torch.allclose(a.values, b.values, atol=1e-4)
    # the head's cache holds exactly the committed pairs; the rest are pending
    assert kv.cache_length(run.draft_cache) + len(run.pending_tokens) == len(run.tokens) - 1


def test_the_prefill_reads_the_prompt_into_the_head(tiny, monkeypatch):
    """Reading the prompt's pairs through the head is prompt work: the prefill does it (in its
    record's draft_ms, outside the decoding rate), all but the last pair, which the first step
    reads as every step reads its pending pairs. The drafts are those of reading every pair in
    the first step (bit for bit on the fast kernels: a row's result does not depend on the rows
    read with it)."""
    from app.engine import engine as engine_module
    from app.engine import head_draft

    target, head = tiny
    engine = Engine(target, head)
    cfg = TreeConfig(method="dynamic", depth=3, top_k=2, total_tokens=6)
    prompt = [5, 17, 33, 90, 4, 61, 2, 40]

    def run_steps():
        run, first = engine._prefill(prompt, cfg, SamplingConfig(), 100, cfg)
        after_prefill = (kv.cache_length(run.draft_cache), len(run.pending_tokens), first.draft_ms > 0)
        generated, drafts = list(first.new_tokens), []
        for i in range(1, 7):
            event = engine._step(run, cfg, SamplingConfig(), i, 100, generated)
            generated += event.new_tokens
            drafts.append((event.tree.tokens, event.tree.q))
        return after_prefill, drafts, generated

    after_prefill, drafts, generated = run_steps()
    assert after_prefill == (len(prompt) - 1, 1, True)
    # as before: the prefill leaves every pair pending and the first step reads them all
    monkeypatch.setattr(engine_module, "read_pending",
                        lambda draft, run, leave=0: (None, 0) if leave else head_draft.read_pending(draft, run))
    before, drafts_before, generated_before = run_steps()
    assert before[:2] == (0, len(prompt))
    assert generated == generated_before
    exact = isinstance(engine.draft_model.forward, rowwise.RowwiseDraftHead)
    for (tokens, q), (tokens_before, q_before) in zip(drafts, drafts_before):
        assert tokens == tokens_before
        assert q == q_before if exact else torch.allclose(torch.tensor(q), torch.tensor(q_before), atol=1e-5)


@pytest.mark.skipif(kernels.load() is None, reason=f"fast kernels unavailable: {kernels.why_not()}")
def test_keep_positions_follows_a_buffer_that_grew_between_steps():
    """``kv.keep_positions`` keeps the C call's pointers while the buffers stay; a layer whose
    buffer grew between two steps (a new tensor) must be compacted in its new buffer, as the
    torch gather does, not in the old one the kept pointers name."""
    kernels.load()
    g = torch.Generator().manual_seed(1)
    caches = []
    for _ in range(2):
        cache = DynamicCache()
        cache.layers = [kv.PreallocatedLayer(12) for _ in range(2)]
        caches.append(cache)
    # step 1: 4 cached positions + 6 in a tree; step 2: the 6 kept + 9 outgrow capacity 12
    for step, (start, n) in enumerate([(4, 6), (6, 9)]):
        fresh = n + (start if step == 0 else 0)                     # positions written this step
        rows = [(torch.randn(1, 2, fresh, 8, generator=g), torch.randn(1, 2, fresh, 8, generator=g)) for _ in range(2)]
        for cache in caches:
            for layer, (keys, values) in zip(cache.layers, rows):
                if step:
                    layer.length = start                            # what the last step kept: 4 + 3 >= 6
                first, key_buffer, value_buffer = layer.reserve(fresh, 2, 8)
                key_buffer[:, :, first:first + fresh], value_buffer[:, :, first:first + fresh] = keys, values
        in_c, in_torch = caches
        offsets = [0, 2, 5]
        kv.keep_positions(in_c, start, offsets)
        index = torch.tensor([start + o for o in offsets])
        for layer in in_torch.layers:
            layer.gather_tail(start, index)
        assert in_c.layers[0].capacity == (12 if step == 0 else 24)
        for a, b in zip(in_c.layers, in_torch.layers):
            assert a.length == b.length == start + len(offsets)
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
