"""The fast target forward (app/engine/rowwise.py on app/engine/kernels): it computes what
the model computes, a row's bits never depend on the other rows of its forward (so greedy
EAGLE equals the same engine's vanilla in float32 and bfloat16 alike), its build is cached,
and without a compiler the engine falls back to the eager forward with one line."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from app.engine import forward, fused, kernels, kv
from app.engine.config import SamplingConfig, TreeConfig
from app.engine.engine import Engine
from app.engine.loading import Target
from app.engine.rowwise import RowwiseDraftHead, RowwiseEagle3Head, RowwiseLlamaDecoder
from app.engine.tree import tree_attention_mask
from tests.tiny import random_head, tiny_target

pytestmark = pytest.mark.skipif(kernels.load() is None, reason=f"fast kernels unavailable: {kernels.why_not()}")


def random_tree(n: int, seed: int) -> list[int]:
    """Parents of n nodes, each under the root (-1) or an earlier node."""
    rng = random.Random(seed)
    return [rng.randrange(-1, i) for i in range(n)]


def depths_of(parents: list[int]) -> list[int]:
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p == -1 else depths[p] + 1)
    return depths


@torch.inference_mode()
def tree_rows_equal_decoded_rows(decoder, model, prefix: list[int], root: int, tokens: list[int],
                                 parents: list[int], nodes: list[int]) -> None:
    """The tree forward's row for each node in ``nodes`` (hidden state and logits) equals the
    row plain decoding computes for it: the root and then its ancestors fed one token at a
    time on the same prefix."""
    cache = kv.preallocated_cache(model, len(prefix) + len(tokens) + 8)
    decoder.prefill(torch.tensor([prefix]), cache)
    m = len(prefix)
    depths = depths_of(parents)
    mask = torch.cat([torch.ones(len(tokens) + 1, m, dtype=torch.bool), tree_attention_mask(parents)], 1)
    pos = torch.tensor([[m] + [m + d for d in depths]])
    tree_hidden = decoder(torch.tensor([[root] + tokens]), pos, mask[None, None], cache)[0]   # (N+1, H)
    tree_logits = decoder.logits(tree_hidden)
    for node in nodes:
        path = [node]
        while parents[path[-1]] != -1:
            path.append(parents[path[-1]])
        chain = [root] + [tokens[i] for i in reversed(path)]
        kv.crop(cache, m)
        for j, tok in enumerate(chain):
            hidden = decoder(torch.tensor([[tok]]), torch.tensor([[m + j]]), None, cache)[0, 0]
        assert torch.equal(hidden, tree_hidden[node + 1]), f"node {node}: {(hidden - tree_hidden[node + 1]).abs().max()}"
        assert torch.equal(decoder.logits(hidden[None])[0], tree_logits[node + 1])
    kv.crop(cache, m)
    # the root alone, as a vanilla step computes it
    alone = decoder(torch.tensor([[root]]), torch.tensor([[m]]), None, cache)[0, 0]
    assert torch.equal(alone, tree_hidden[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 5, 13, 40])
def test_tree_rows_are_bit_identical_to_one_token_steps_tiny(n, dtype):
    target = tiny_target(seed=4)
    target.model.to(dtype)
    decoder = forward.decoder_forward(Target(model=target.model, tokenizer=target.tokenizer, name="tiny",
                                           device=target.device, dtype=dtype))
    assert isinstance(decoder, RowwiseLlamaDecoder)
    rng = random.Random(n)
    parents = random_tree(n, seed=n)
    tokens = [rng.randrange(3, 100) for _ in range(n)]
    nodes = sorted(range(n), key=lambda i: -depths_of(parents)[i])[:4]     # the deepest ones
    tree_rows_equal_decoded_rows(decoder, target.model, [5, 6, 7, 8, 9, 10, 11], 12, tokens, parents, nodes)


@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 24])
def test_tree_rows_are_bit_identical_to_one_token_steps_embedded(embedded_target, n):
    decoder = forward.decoder_forward(embedded_target)
    assert isinstance(decoder, RowwiseLlamaDecoder)
    ids = embedded_target.tokenizer("A hash map stores keys and values so that a lookup")["input_ids"]
    rng = random.Random(n)
    parents = random_tree(n, seed=n)
    tokens = [rng.randrange(100, 40000) for _ in range(n)]
    deepest = max(range(n), key=lambda i: depths_of(parents)[i])
    tree_rows_equal_decoded_rows(decoder, embedded_target.model, ids[:-1], ids[-1], tokens, parents,
                                 [deepest, n - 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_call_decoder_is_the_per_kernel_forward_bit_for_bit(dtype):
    """``kernels.decoder`` (the stack in one C call, writing the cache in place) computes what
    the per-kernel path computes: hidden states, tapped layer inputs, logits and the cached
    keys and values, over a prefill, a causal block and a tree, across a cache that grows.
    A cache of another kind takes the per-kernel path, with the same bits."""
    from transformers import DynamicCache

    target = tiny_target(seed=7, layers=3)
    target.model.to(dtype)
    decoder = forward.decoder_forward(Target(model=target.model, tokenizer=target.tokenizer, name="tiny",
                                             device=target.device, dtype=dtype))
    assert isinstance(decoder, RowwiseLlamaDecoder) and decoder.one_call
    prefix = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13]])
    m = prefix.shape[1]
    parents = [-1, 0, 0, 1, -1, 4]
    tree_mask = torch.cat([torch.ones(7, m, dtype=torch.bool), tree_attention_mask(parents)], 1)[None, None]
    tree_pos = torch.tensor([[m] + [m + d for d in depths_of(parents)]])
    steps = [(torch.tensor([[20, 21, 22, 23]]), torch.arange(m, m + 4)[None],
              torch.ones(4, m + 4, dtype=torch.bool).tril(m)[None, None]),            # a causal block
             (torch.tensor([[30, 31, 32, 33, 34, 35, 36]]), tree_pos, tree_mask),       # a tree
             (torch.tensor([[40]]), torch.tensor([[m]]), None)]                         # one token

    def run(one_call: bool, cache) -> list[torch.Tensor]:
        decoder.one_call = one_call
        with torch.inference_mode():
            hidden, taps = decoder.prefill(prefix, cache, layers=(2, 0))
            out = [hidden, taps]
            for ids, pos, mask in steps:
                hidden, taps = decoder(ids, pos, mask, cache, layers=(1,))
                out += [hidden, taps, decoder.logits(hidden[0])]
                out += [t.clone() for layer in cache.layers for t in (layer.keys, layer.values)]
                kv.crop(cache, m)
        return out

    try:
        fused_run = run(True, kv.preallocated_cache(target.model, 4))      # capacity 4: the cache grows
        for reference in (run(False, kv.preallocated_cache(target.model, 4)), run(True, DynamicCache())):
            assert len(reference) == len(fused_run)
            for a, b in zip(fused_run, reference):
                assert a.shape == b.shape and torch.equal(a, b), (a - b).abs().max()
    finally:
        decoder.one_call = True


@pytest.mark.parametrize("gather", ["c", "torch"])
def test_the_kept_transposed_keys_follow_a_compacted_cache(gather, monkeypatch):
    """Attention reads the keys from a transposed copy kept beside the cache and brought up to
    date from a watermark. After a tree step whose accepted path is not the first positions,
    ``kv.keep_positions`` moves keys below the watermark (in C, or in torch without the C
    kernels' plan); the next steps must see the moved keys: the one-call forward (kept copy)
    gives the bits of the per-kernel one (keys transposed afresh each call)."""
    target = tiny_target(seed=7, layers=2)
    decoder = forward.decoder_forward(Target(model=target.model, tokenizer=target.tokenizer, name="tiny",
                                             device=target.device, dtype=torch.float32))
    assert isinstance(decoder, RowwiseLlamaDecoder) and decoder.one_call
    if gather == "torch":
        monkeypatch.setattr(kernels, "keep_rows_plan", lambda buffers: None)
    prefix = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13]])
    m = prefix.shape[1]
    parents = [-1, -1, 1, 2]                      # root, then two branches; the second is accepted
    mask = torch.cat([torch.ones(5, m, dtype=torch.bool), tree_attention_mask(parents)], 1)[None, None]
    pos = torch.tensor([[m] + [m + d for d in depths_of(parents)]])

    def run(one_call: bool) -> list[torch.Tensor]:
        decoder.one_call = one_call
        cache = kv.preallocated_cache(target.model, 32)
        with torch.inference_mode():
            out = [decoder.prefill(prefix, cache)]
            out.append(decoder(torch.tensor([[30, 31, 32, 33, 34]]), pos, mask, cache))
            kv.keep_positions(cache, m, [0, 2, 3, 4])             # root, nodes 1, 2, 3 -> m .. m+3
            assert all(layer.key_t_valid.value <= m for layer in cache.layers)
            for j, token in enumerate([40, 41]):                   # plain steps after the compacted path
                out.append(decoder(torch.tensor([[token]]), torch.tensor([[m + 4 + j]]), None, cache))
        return out

    try:
        kept, fresh = run(True), run(False)
    finally:
        decoder.one_call = True
    for a, b in zip(kept, fresh):
        assert torch.equal(a, b), (a - b).abs().max()


@pytest.mark.parametrize("dtype,int8", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_the_heads_one_call_layer_is_its_per_kernel_forward_bit_for_bit(dtype, int8):
    """An EAGLE head's layer on the fast kernels runs as one ``kernels.decoder`` call (no input
    norm, no final norm; RoPE from a table): over the pending pairs, then tree levels with their
    own masks, the outputs and the keys and values it caches are those of the per-kernel path
    with the head's own rotary embedding, bit for bit; with its weights in int8 as well."""
    target = tiny_target(seed=3)
    head = random_head(target, seed=4).to(dtype)
    draft = RowwiseDraftHead(head, int8)
    assert RowwiseDraftHead.supports(head) and draft.one_call
    assert draft.qkv.format == draft.down.format == (kernels.INT8 if int8 else kernels.BF16 if dtype == torch.bfloat16
                                                     else kernels.F32)
    g = torch.Generator().manual_seed(0)
    H = target.model.config.hidden_size
    caches = (kv.preallocated_cache(None, 4), kv.preallocated_cache(None, 4))    # capacity 4: they grow
    length = 0
    with torch.inference_mode():
        for T in (5, 1, 3, 2):
            emb, feat = torch.randn(1, T, H, generator=g), torch.randn(1, T, H, generator=g)
            pos = torch.arange(length, length + T)[None]
            mask = torch.ones(T, length + T, dtype=torch.bool).tril(length)
            mask[-1, 0] = False                                                   # a row that may not see key 0
            one_call = draft(emb, feat, pos, mask[None, None], caches[0])
            x = kernels.linear(torch.cat((emb[0], feat[0]), dim=-1), draft.fc)
            x = x + draft.fc_bias if draft.fc_bias is not None else x
            cos, sin = head.rotary_emb(x[None], position_ids=pos)       # the head's own, per call (the one-call
            per_kernel = draft._forward_per_kernel(x, cos[0], sin[0], T, draft.head_dim, mask[None, None],
                                                   caches[1])              # path reads a table of them)
            length += T
            assert torch.equal(one_call, per_kernel), (one_call - per_kernel).abs().max()
            a, b = caches[0].layers[0], caches[1].layers[0]
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and a.length == length


@pytest.mark.parametrize("dtype,int8", [(torch.float32, False), (torch.bfloat16, True)])
def test_the_heads_forward_without_a_mask_is_causal_over_its_cache(dtype, int8):
    """The engine feeds the head its pending pairs with no mask on the fast kernels
    (``causal_without_mask``): row i must see the cache and rows 0..i, bit for bit what the
    causal mask says, in the outputs and in the keys and values cached."""
    target = tiny_target(seed=3)
    draft = RowwiseDraftHead(random_head(target, seed=4).to(dtype), int8)
    assert draft.causal_without_mask
    g = torch.Generator().manual_seed(1)
    H = target.model.config.hidden_size
    caches = (kv.preallocated_cache(None, 4), kv.preallocated_cache(None, 4))
    length = 0
    with torch.inference_mode():
        for T in (5, 1, 3, 2):
            emb, feat = torch.randn(1, T, H, generator=g), torch.randn(1, T, H, generator=g)
            pos = torch.arange(length, length + T)[None]
            causal = torch.ones(T, length + T, dtype=torch.bool).tril(length)[None, None]
            none, masked = draft(emb, feat, pos, None, caches[0]), draft(emb, feat, pos, causal, caches[1])
            length += T
            assert torch.equal(none, masked), (none - masked).abs().max()
            a, b = caches[0].layers[0], caches[1].layers[0]
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_embedding_lookup_is_torchs_bit_for_bit(dtype):
    """``kernels.embed`` (the fast forward's first step) gives index_select's rows widened to
    float32, exactly; a token id outside the table is an error, not a read past it."""
    kernels.load()
    table = (torch.randn(300, 40, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    ids = [0, 299, 7, 7, 123]
    assert torch.equal(kernels.embed(table, ids), table[ids].float())
    with pytest.raises(IndexError):
        kernels.embed(table, [300])
    assert kernels.embed(table.t(), ids) is None          # not contiguous: the caller's torch path


def test_node_probs_are_softmax_of_each_nodes_parent_row():
    """The step record's p of every node (``kernels.node_probs``): softmax of the node's token in
    its parent's row of logits, rows read in any order and more than once."""
    kernels.load()
    x = torch.randn(4, 49152, generator=torch.Generator().manual_seed(5)) * 6
    rows, tokens = [2, 0, 2, 3], [11, 49151, 400, 0]
    p = kernels.node_probs(x, rows, tokens)
    want = torch.softmax(x, -1)[rows, tokens]
    assert torch.allclose(torch.tensor(p), want, rtol=1e-5, atol=1e-12)
    assert kernels.node_probs(x, [], []) == []


def test_one_decoder_serves_two_caches_in_turn():
    """The C layers point at a cache's buffers until another cache (or a grown one) comes: a
    page racing two runs on one target alternates caches step by step. Interleaved, each run
    computes what it computes alone."""
    target = tiny_target(seed=9, layers=2)
    decoder = forward.decoder_forward(target)
    assert isinstance(decoder, RowwiseLlamaDecoder)
    prompts = (torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[40, 41, 42]]))

    def steps(cache, prompt, i):
        m = prompt.shape[1]
        if i == 0:
            return decoder.prefill(prompt, cache)
        return decoder(torch.tensor([[10 + i]]), torch.tensor([[m + i - 1]]), None, cache)

    with torch.inference_mode():
        alone = []
        for prompt, capacity in zip(prompts, (4, 64)):
            cache = kv.preallocated_cache(target.model, capacity)
            alone.append([steps(cache, prompt, i).clone() for i in range(6)])
        caches = [kv.preallocated_cache(target.model, 4), kv.preallocated_cache(target.model, 64)]
        for i in range(6):
            for r in range(2):
                assert torch.equal(steps(caches[r], prompts[r], i), alone[r][i]), (r, i)


def answer(engine, tree, n, prompt=None, prompt_ids=None) -> list[int]:
    events = list(engine.generate(prompt, prompt_ids=prompt_ids, tree=tree, sampling=SamplingConfig(temperature=0.0),
                                  max_new_tokens=n))
    return [t for e in events[:-1] for t in e.new_tokens]


def test_kernels_compute_what_torch_computes():
    g = torch.Generator().manual_seed(0)
    for N, K in [(100, 64), (33, 17), (320, 96)]:
        w = torch.randn(N, K, generator=g)
        x = torch.randn(7, K, generator=g)
        torch.testing.assert_close(kernels.linear(x, kernels.Packed(w)), x @ w.T, rtol=1e-5, atol=1e-5)
        wb = w.bfloat16()
        # with native bfloat16 dot products the rows are rounded to bfloat16 too
        xr = x.bfloat16().float() if kernels.load().rowwise_bf16_pairs() else x
        torch.testing.assert_close(kernels.linear(x, kernels.Packed(wb)), xr @ wb.float().T, rtol=1e-5, atol=1e-5)
    x = torch.randn(5, 96, generator=g) * 3
    w = torch.rand(96, generator=g) + 0.5
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-5), F.rms_norm(x, (96,), w, 1e-5), rtol=2e-6, atol=1e-6)
    gu = torch.randn(5, 2 * 40, generator=g) * 4      # 40: a vector body and a tail
    torch.testing.assert_close(kernels.silu_mul(gu), F.silu(gu[:, :40]) * gu[:, 40:], rtol=2e-6, atol=1e-6)
    # attention: 6 query heads over 2 key/value heads, a tree mask and the causal default
    n, L, d = 4, 23, 40
    q = torch.randn(n, 6, d, generator=g)
    k, v = torch.randn(2, L, d, generator=g), torch.randn(2, L, d, generator=g)
    mask = torch.rand(n, L, generator=g) > 0.4
    mask[:, 0] = True
    ref = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask[None, None],
                                         scale=0.3, enable_gqa=True)[0].transpose(0, 1).reshape(n, -1)
    torch.testing.assert_close(kernels.attention(q, k, v, mask, 0.3), ref, rtol=1e-5, atol=1e-5)
    causal = torch.ones(n, L, dtype=torch.bool).tril(L - n)
    torch.testing.assert_close(kernels.attention(q, k, v, None, 0.3), kernels.attention(q, k, v, causal, 0.3),
                               rtol=0, atol=0)


def test_attention_row_is_the_same_whether_unseen_keys_are_absent_or_masked():
    """A decode step's row sees exactly its keys; the same row inside a tree sees more keys,
    masked. Key blocks fall differently in the two (keys are scored four at a time), and the
    bits must not change."""
    g = torch.Generator().manual_seed(1)
    n, L, d = 5, 13, 64
    q = torch.randn(n, 6, d, generator=g)
    k, v = torch.randn(2, L, d, generator=g), torch.randn(2, L, d, generator=g)
    causal = kernels.attention(q, k, v, None, 0.125)
    for i in range(n):
        keys = L - n + i + 1
        alone = kernels.attention(q[i:i + 1], k[:, :keys], v[:, :keys], None, 0.125)
        seen = torch.zeros(1, L, dtype=torch.bool)
        seen[0, :keys] = True
        assert torch.equal(alone, causal[i:i + 1])
        assert torch.equal(kernels.attention(q[i:i + 1], k, v, seen, 0.125), alone)


def test_the_avx2_and_avx512_builds_give_the_same_bits(kernel_build):
    """The kernels have one arithmetic per element on every ISA; the ISAs differ only in how
    it is vectorised (AVX2's exp is written in ymm intrinsics, AVX-512's is a lane loop gcc
    vectorises). Built both ways on this CPU, SwiGLU, attention (softmax numerators through
    that exp, over large, small and masked scores) and a float32 and an int8 linear give the
    same bits.
    An AVX2-only machine runs the AVX2 build here against itself."""
    import ctypes

    builds = {kind: kernels.declare(ctypes.CDLL(str(kernel_build(kind))), kind)
              for kind in dict.fromkeys(["avx2", kernels.isa()])}
    g = torch.Generator().manual_seed(5)
    gate_up = torch.cat([torch.randn(3, 1536, generator=g) * 30, torch.randn(3, 1536, generator=g)], 1)
    gate_up[0, :8] = torch.tensor([100.0, -100.0, 88.5, -87.5, 0.0, -0.0, 1e-30, float("-inf")])
    q = torch.randn(4, 6, 64, generator=g) * 4
    k, v = torch.randn(2, 40, 64, generator=g), torch.randn(2, 40, 64, generator=g)
    seen = torch.rand(4, 40, generator=g) > 0.3
    seen[:, 0] = True
    w, x = torch.randn(100, 64, generator=g), torch.randn(7, 64, generator=g)
    results = {}
    try:
        for kind, lib in builds.items():
            kernels._lib = lib
            results[kind] = [kernels.silu_mul(gate_up), kernels.attention(q, k, v, seen, 0.125),
                             kernels.attention(q, k, v, None, 3.0), kernels.linear(x, kernels.Packed(w)),
                             kernels.linear(x, kernels.Packed(w, int8=True))]
    finally:
        kernels.reset()
        kernels.load()
    first, *others = results.values()
    for other in others:
        for a, b in zip(first, other):
            assert torch.equal(a, b), (a - b).abs().max()


@pytest.mark.parametrize("kind", ["avx2", "avx512"])
def test_bfloat16_weights_widened_in_registers_compute_what_torch_computes(kind, kernel_build):
    """CPUs without bfloat16 dot products widen each bfloat16 weight to float32 in registers,
    from a packing of their own (k in pairs, chunks shuffled within 128-bit lanes). Built for
    that ISA on this CPU: every row count from one to past two register blocks, odd and even
    K, a last group of fewer columns, against torch in float32."""
    import ctypes

    if kind == "avx512" and not {"avx512f", "avx512bw"} <= kernels.cpu_flags():
        pytest.skip("no AVX-512 on this CPU")
    lib, ours = kernels.declare(ctypes.CDLL(str(kernel_build(kind))), kind), kernels.load()
    assert lib.rowwise_bf16_unpack() and not lib.rowwise_bf16_pairs()
    g = torch.Generator().manual_seed(7)
    try:
        kernels._lib = lib
        for N, K in [(100, 64), (49, 33), (200, 96)]:
            w = torch.randn(N, K, generator=g).bfloat16()
            packed = kernels.Packed(w)
            x = torch.randn(2 * lib.rowwise_block_rows() + 1, K, generator=g)
            for m in range(1, x.shape[0] + 1):
                torch.testing.assert_close(kernels.linear(x[:m], packed), x[:m] @ w.float().T, rtol=1e-5, atol=1e-5)
    finally:
        kernels._lib = ours


@pytest.mark.parametrize("kind", ["avx2", "avx512"])
def test_int8_weights_compute_the_product_with_the_quantized_weight(kind, kernel_build):
    """A draft head's int8 weights (``Packed(w, int8=True)``): each output is x times the
    dequantized row ``q * scale`` (to float32 rounding), every row count from one to past two
    register blocks, a last group of fewer columns, and a row's bits are the same computed
    alone or beside others, on each ISA's build (both give the same bits: the next test)."""
    import ctypes

    if kind == "avx512" and not {"avx512f", "avx512bw"} <= kernels.cpu_flags():
        pytest.skip("no AVX-512 on this CPU")
    lib, ours = kernels.declare(ctypes.CDLL(str(kernel_build(kind))), kind), kernels.load()
    g = torch.Generator().manual_seed(11)
    try:
        kernels._lib = lib
        for N, K in [(100, 64), (49, 33), (200, 96)]:
            w = torch.randn(N, K, generator=g).bfloat16()
            w[3] = 0                                                  # an all-zero row
            packed = kernels.Packed(w, int8=True)
            padded = -(-N // kernels.group()) * kernels.group()
            assert packed.format == kernels.INT8 and packed.data.numel() == padded * (K + 4)   # bytes: int8 + scales
            q, scale = kernels.quantize_int8(w)
            assert q.abs().max() == 127 and (q.float() * scale[:, None] - w.float()).abs().max() <= scale.max() / 2
            x = torch.randn(2 * lib.rowwise_block_rows() + 1, K, generator=g)
            y = kernels.linear(x, packed)
            torch.testing.assert_close(y, (x.double() @ (q.double() * scale.double()[:, None]).T).float(),
                                       rtol=1e-5, atol=1e-5)
            for m in range(1, x.shape[0] + 1):
                assert torch.equal(kernels.linear(x[m - 1:m], packed)[0], y[m - 1])
                assert torch.equal(kernels.linear(x[:m], packed), y[:m])
    finally:
        kernels._lib = ours


@pytest.mark.parametrize("V", [49152, 8192, 33, 5])
def test_argmax_and_top_probs_answer_as_torch_does(V):
    """The greedy token (``verify.argmax`` -> ``kernels.argmax``) is torch.argmax's: the first
    of tied maxima, a NaN or an infinity where there is one. ``kernels.top_probs`` gives
    softmax's k best probabilities (the earlier index first on a tie) and the logsumexp."""
    from app.engine import verify

    kernels.load()
    g = torch.Generator().manual_seed(V)
    x = torch.randn(5, V, generator=g) * 5
    x[1, 1] = x[1].max() + 1
    x[1, V - 2] = x[1, 1]                                   # a tie: the first wins
    x[2, V // 2] = float("nan")
    x[3, 1], x[3, V - 1] = float("inf"), float("nan")       # the first special one
    x[4, V - 1] = x[4].max() + 1                            # the maximum in the tail
    for row in x:
        assert kernels.argmax(row) == int(row.argmax()) == verify.argmax(row)
    q, idx, lse = kernels.top_probs(x[[0, 1, 4]], 4)
    assert torch.allclose(lse, torch.logsumexp(x[[0, 1, 4]], -1), rtol=1e-6)
    probs = torch.softmax(x[[0, 1, 4]], -1)
    # rtol: torch's softmax itself moves by up to 4.4e-6 over 49,152 entries in its AVX2 build
    assert torch.allclose(q, probs.gather(-1, idx), rtol=1e-5, atol=1e-9)
    assert torch.equal(q, q.sort(-1, descending=True).values) and torch.equal(probs.topk(4).values.sort(-1).values,
                                                                            probs.gather(-1, idx).sort(-1).values)
    assert idx[1, 0] == 1 and idx[1, 1] == V - 2


def test_a_rows_bits_do_not_depend_on_the_register_block_shape(kernel_build):
    """The linear kernel's register block (GV weight vectors by MB rows) is a speed choice:
    a build with another shape, packing its own weights, must give every row the same bits,
    for row counts that fill, split and overflow either shape's blocks."""
    import ctypes

    kind = kernels.isa()
    other_shape = {"avx2": ["-DGV=2", "-DMB=6"],          # the former shapes
                   "amx": ["-DMB=12", "-DAMX_ROWS=8"]}.get(kind, ["-DGV=2", "-DMB=12"])   # AMX: 8-row tiles
    other, ours = kernels.declare(ctypes.CDLL(str(kernel_build(kind, *other_shape))), kind), kernels.load()
    assert (other.rowwise_group(), other.rowwise_block_rows()) != (ours.rowwise_group(), ours.rowwise_block_rows())
    g = torch.Generator().manual_seed(3)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            for N, K in [(100, 64), (49, 33), (200, 96)]:
                w = torch.randn(N, K, generator=g).to(dtype)
                x = torch.randn(14, K, generator=g)
                kernels._lib = other
                theirs = [kernels.linear(x[:m], kernels.Packed(w)) for m in range(1, 15)]
                kernels._lib = ours
                packed = kernels.Packed(w)
                for m in range(1, 15):
                    assert torch.equal(kernels.linear(x[:m], packed), theirs[m - 1]), (dtype, N, K, m)
    finally:
        kernels._lib = ours


def test_cost_curves_are_keyed_by_the_kernel_source(monkeypatch, tmp_path):
    """A forward-cost curve measured with one version of the kernels must not steer the tree
    choice of another: the fast forward's name (part of the autotune key) names the source."""
    from app.engine.autotune import cost_cache_key

    tiny = tiny_target(seed=4)

    def key() -> dict:       # a fresh Target: the forward is built once per target
        return cost_cache_key(Target(model=tiny.model, tokenizer=tiny.tokenizer, name="tiny",
                                     device=tiny.device, dtype=torch.float32))

    before = key()
    assert before == key() and "rowwise" in before["forward"]
    edited = tmp_path / "rowwise.c"
    edited.write_bytes(kernels.SOURCE.read_bytes() + b"\n/* a change */\n")
    monkeypatch.setattr(kernels.builds, "SOURCE", edited)
    after = key()
    assert after["forward"] != before["forward"] and {**after, "forward": None} == {**before, "forward": None}


def test_the_lm_head_batches_every_row_of_trees_within_one_register_block():
    """Up to a block of rows the LM head reads its weight once, so verify computes every
    row's logits in one call (``lm_head_all_rows_up_to``); beyond that only the rows
    verification can visit. The threshold follows the build's block height for the weights'
    dtype (AMX tiles hold 16 rows of bfloat16; float32 weights keep the register block)."""
    lib = kernels.load()
    for dtype, rows in ((torch.float32, lib.rowwise_block_rows_f32()), (torch.bfloat16, lib.rowwise_block_rows())):
        tiny = tiny_target(seed=4)
        tiny.model.to(dtype)
        decoder = forward.decoder_forward(Target(model=tiny.model, tokenizer=tiny.tokenizer, name="tiny",
                                                 device=tiny.device, dtype=dtype))
        assert decoder.lm_head_all_rows_up_to == kernels.block_rows(bf16=dtype == torch.bfloat16) == rows
    assert lib.rowwise_block_rows() == (16 if kernels.amx() else lib.rowwise_block_rows_f32())


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (10, 2, 32), (8, 1, 48), (4, 4, 64)])
def test_a_heads_attention_does_not_depend_on_the_heads_that_share_its_pass(heads, kv_heads, d):
    """Up to four query heads of one key/value head are scored and summed in one pass over
    the keys (SmolLM2: 9 over 3). Each head's bits must be those of the head computed alone,
    for any group size, head width and row count."""
    g = torch.Generator().manual_seed(2)
    n, L = 6, 45
    q = torch.randn(n, heads, d, generator=g)
    k, v = torch.randn(kv_heads, L, d, generator=g), torch.randn(kv_heads, L, d, generator=g)
    mask = torch.rand(n, L, generator=g) > 0.3
    mask[:, 0] = True
    together = kernels.attention(q, k, v, mask, 0.125).view(n, heads, d)
    group = heads // kv_heads
    for h in range(heads):
        kv = h // group
        alone = kernels.attention(q[:, h:h + 1].contiguous(), k[kv:kv + 1], v[kv:kv + 1], mask, 0.125)
        assert torch.equal(together[:, h], alone), f"head {h}"
    ref = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask[None, None],
                                         scale=0.125, enable_gqa=True)[0].transpose(0, 1)
    torch.testing.assert_close(together, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("masked", [False, True])
def test_a_rows_attention_does_not_depend_on_the_rows_that_share_its_pass(masked, threads):
    """On AVX-512 two rows' query heads share a pass over the keys (rowwise_attention_rows);
    a pass runs over the keys its most-seeing row may see, and the other row's extra keys must
    get probability exactly 0. Each row's bits must be those of the row computed alone, over
    exactly its keys (causal) or under its mask row, for odd and even row counts."""
    g = torch.Generator().manual_seed(3)
    n, L, d = 7, 70, 64
    q = torch.randn(n, 9, d, generator=g)
    k, v = torch.randn(3, L, d, generator=g), torch.randn(3, L, d, generator=g)
    mask = torch.rand(n, L, generator=g) > 0.4 if masked else None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = kernels.attention(q, k, v, mask, 0.125)
        for i in range(n):
            if masked:
                alone = kernels.attention(q[i:i + 1], k, v, mask[i:i + 1], 0.125)
            else:
                keys = L - n + i + 1
                alone = kernels.attention(q[i:i + 1], k[:, :keys].contiguous(), v[:, :keys].contiguous(), None, 0.125)
            assert torch.equal(together[i:i + 1], alone), f"row {i}"
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_eagle_equals_vanilla_on_the_fast_forward(dtype):
    """The engine's lossless claim in the fast mode: greedy EAGLE with the shipped head, over
    tree sizes from a chain to the paper's 60 nodes, gives exactly the tokens of the same
    engine's vanilla decoding."""
    from app.engine.factory import load_engine

    engine, _ = load_engine(device="cpu", dtype=dtype)
    assert isinstance(engine.decoder, RowwiseLlamaDecoder)
    assert engine.draft_model.forward.qkv.format == engine.draft_model.lm_packed.format == kernels.INT8   # the default draft
    for prompt in ("Write a short poem about the sea.", "What is 17 times 23? Show the steps."):
        vanilla = answer(engine, TreeConfig(method="vanilla"), 40, prompt)
        for tree in (TreeConfig(method="chain", depth=4), TreeConfig(total_tokens=8, depth=3, top_k=3),
                     TreeConfig(total_tokens=60, depth=5, top_k=10)):
            assert answer(engine, tree, 40, prompt) == vanilla, (dtype, prompt, tree.shape())


def test_the_heads_byte_mask_drafts_the_trees_its_bool_mask_drafts(monkeypatch):
    """The head's in-step mask built as bytes (``tree.mask_rows``: the committed pairs,
    the node's ancestors, itself) drafts the very trees the bool mask it replaced drafts: every
    step's tokens and draft probabilities agree bit for bit over a 3-level tree."""
    from app.engine.factory import load_engine

    engine, _ = load_engine(device="cpu", dtype="bfloat16")
    tree = TreeConfig(total_tokens=8, depth=3, top_k=3)

    def drafts():
        events = list(engine.generate("Write a short poem about the sea.", tree=tree,
                                      sampling=SamplingConfig(temperature=0.0), max_new_tokens=24))
        return [(e.tree.tokens, e.tree.q) for e in events if getattr(e, "tree", None) is not None]

    as_bytes = drafts()
    monkeypatch.setattr(RowwiseDraftHead, "takes_row_masks", False)      # the bool (1, 1, F, S) mask
    as_bools = drafts()
    assert len(as_bytes) > 3 and any(len(t) > 3 for t, _ in as_bytes) and as_bytes == as_bools


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle2", "eagle3"])
def test_the_int8_draft_accepts_about_as_much_as_the_heads_own_weights(name):
    """The default draft reads int8 weights (the head's layer and its draft LM head; EAGLE-3's
    own LM head): faster to read, and its proposals are nearly the head's own. Over the same
    prompt and trees, the tokens per step of each shipped head stay within a few percent of
    its bfloat16 weights' (a wrong scale or layout would still be lossless, but would propose
    nonsense and accept almost nothing)."""
    from app.engine.factory import load_engine

    engine, _ = load_engine(draft_model=name, device="cpu", dtype="bfloat16")
    own = Engine(engine.target, engine.head, draft_vocab=None if name == "eagle3" else engine.draft_vocab,
                 draft_weights="head")
    fast = own.draft_model.forward
    assert isinstance(fast, RowwiseEagle3Head if name == "eagle3" else RowwiseDraftHead)
    lm = fast.lm_head if name == "eagle3" else own.draft_model.lm_packed
    assert fast.qkv.format == lm.format == kernels.BF16
    assert engine.draft_model.forward.qkv.format == kernels.INT8
    with pytest.raises(ValueError, match="draft_weights"):
        Engine(engine.target, engine.head, draft_weights="int4")
    prompt = "Explain how a bicycle works, step by step."
    for tree in (TreeConfig(total_tokens=4, depth=2, top_k=8), TreeConfig(method="chain", depth=3)):
        tau = []
        for e in (engine, own):
            events = [ev for ev in e.generate(prompt, tree=tree, sampling=SamplingConfig(temperature=0.0),
                                              max_new_tokens=64) if ev.type != "summary" and not ev.prefill]
            tau.append(sum(len(ev.new_tokens) for ev in events) / len(events))
        assert tau[0] >= 0.92 * tau[1] and tau[1] > 1.3, (tree.shape(), tau)


def test_without_a_compiler_the_engine_falls_back_to_eager_with_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))          # no cached build to find
    monkeypatch.setenv("CC", str(tmp_path / "no-such-gcc"))
    kernels.reset()
    try:
        target = tiny_target(seed=5)
        engine = Engine(target, None)
        assert type(engine.decoder) is fused.FusedLlamaDecoder
        assert "no C compiler" in engine.decoder.fallback_reason
        err = capsys.readouterr().err
        assert err.count("[eagle-lens]") == 1 and "eager forward" in err
        ids = [5, 6, 7, 8, 9]
        out = answer(engine, TreeConfig(method="vanilla"), 8, prompt_ids=ids)
        with torch.no_grad():
            ref = target.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):]
        assert out == ref.tolist()[: len(out)] and out
    finally:
        kernels.reset()


def test_the_build_is_cached_and_reused_without_a_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))
    kernels.reset()
    try:
        said: list[str] = []
        assert kernels.load(log=said.append) is not None
        built = sorted((tmp_path / "kernels").glob("rowwise-*.so"))
        assert len(built) == 1 and len(said) == 1 and "compiling" in said[0]
        stamp = built[0].stat().st_mtime_ns
        kernels.reset()
        monkeypatch.setenv("CC", str(tmp_path / "no-such-gcc"))     # a warm start needs no compiler
        said.clear()
        assert kernels.load(log=said.append) is not None
        assert said == [] and built[0].stat().st_mtime_ns == stamp
    finally:
        kernels.reset()


def test_forward_eager_switches_the_fast_forward_off():
    target = tiny_target(seed=6)
    off = Target(model=target.model, tokenizer=target.tokenizer, name="tiny", device=target.device,
                 dtype=target.dtype, forward="eager")
    decoder = forward.decoder_forward(off)
    assert type(decoder) is fused.FusedLlamaDecoder and "switched off" in decoder.fallback_reason
    from app.engine.loading import load_target

    with pytest.raises(ValueError, match="forward must be one of"):
        load_target(None, forward="fast-please")


@pytest.mark.parametrize("kind", ["native", "avx2"])
def test_a_rows_bits_do_not_depend_on_how_many_rows_share_the_call(kind, kernel_build):
    """Each row of a linear has the bits it has alone, whatever rows share the call, in every
    weight format: in one register block; in two to four blocks, which go over a group
    chunk by chunk and carry their accumulators between chunks (rowwise/linear.c); in more
    blocks, group by group; and on AMX across tile heights (a step of fewer than 16 rows runs
    tiles of just its rows; more rows fill whole tiles and a zero-padded last one). Built for
    this CPU and for AVX2 (4-row blocks). K = 576: whole tiles of k-pairs, so bfloat16 takes
    the AMX path where the CPU has it; K = 577: odd, the last k-pair half padding."""
    import ctypes

    ours = kernels.load()
    lib = ours if kind == "native" else kernels.declare(ctypes.CDLL(str(kernel_build(kind))), kind)
    block = lib.rowwise_block_rows_f32()
    rows = sorted({2, 3, 5, 8, 9, 15, 16, 17, 20, block + 1, 2 * block + 1, 4 * block, 4 * block + 1})
    g = torch.Generator().manual_seed(11)
    try:
        kernels._lib = lib
        for K in (576, 577):
            x = torch.randn(rows[-1], K, generator=g)
            w = torch.randn(100, K, generator=g)
            for packed in (kernels.Packed(w), kernels.Packed(w.bfloat16()), kernels.Packed(w.bfloat16(), int8=True)):
                alone = torch.cat([kernels.linear(x[i:i + 1], packed) for i in range(rows[-1])])
                for m in rows:
                    assert torch.equal(kernels.linear(x[:m], packed), alone[:m]), (K, packed.format, m)
    finally:
        kernels._lib = ours


def test_a_linear_over_no_rows_is_empty():
    """Zero rows (an empty frontier, a batch with nothing left) give a (0, N) result in every
    weight format; on AMX a tile of no rows cannot even be configured."""
    g = torch.Generator().manual_seed(12)
    w = torch.randn(100, 576, generator=g)
    for packed in (kernels.Packed(w), kernels.Packed(w.bfloat16()), kernels.Packed(w, int8=True)):
        assert kernels.linear(torch.empty(0, 576), packed).shape == (0, 100)


@pytest.mark.skipif(kernels.isa() != "amx", reason="no AMX tiles on this CPU")
def test_bfloat16_linears_run_on_amx_tiles_where_the_cpu_has_them(kernel_build):
    """On a Xeon with AMX the bfloat16 linears run on tiles of 16 rows (a forward over 16
    rows reads each weight once). The tiles round inside a k-pair differently from
    VDPBF16PS, so a build without them gives other bits: the evidence that they ran. A
    linear whose K is no whole number of 16-pair tiles keeps VDPBF16PS, for every row count."""
    import ctypes

    assert kernels.amx() and kernels.block_rows() == 16      # Linux >= 5.16 grants the tile state
    vdp, ours = kernels.declare(ctypes.CDLL(str(kernel_build("avx512bf16"))), "avx512bf16"), kernels.load()
    g = torch.Generator().manual_seed(7)
    results = {}
    try:
        for name, lib in (("vdp", vdp), ("amx", ours)):
            kernels._lib = lib
            results[name] = [kernels.linear(torch.randn(5, K, generator=torch.Generator().manual_seed(K)),
                                            kernels.Packed(torch.randn(96, K, generator=g).bfloat16()))
                             for K in (576, 40)]
            g.manual_seed(7)
    finally:
        kernels._lib = ours
    assert not torch.equal(results["vdp"][0], results["amx"][0])     # K = 576: 18 tiles of k-pairs
    torch.testing.assert_close(results["vdp"][0], results["amx"][0], rtol=1e-5, atol=1e-5)
    assert torch.equal(results["vdp"][1], results["amx"][1])         # K = 40: not whole tiles
