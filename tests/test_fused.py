"""The fused decoder (app/engine/fused.py) computes exactly what transformers' forward does,
costs no extra weight memory, and is skipped for architectures it does not reproduce."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from app.engine import fused, kv
from app.engine.config import SamplingConfig, TreeConfig
from app.engine.engine import Engine
from app.engine.loading import Target
from app.engine.tree import tree_attention_mask
from tests.tiny import random_head, tiny_target, tiny_tokenizer

PARENTS = [-1, -1, 0, 0, 2, 1, 4]          # a branchy tree of 7 nodes


def steps(decoder, model, prefix, root, tokens, cache):
    """Prefill with transformers, then a tree step, a one-token step and a chain step through
    ``decoder``; returns every step's hidden states and the final cache contents."""
    out = []
    with torch.no_grad():
        model.model(input_ids=torch.tensor([prefix]), cache=cache, use_cache=True)
        n0 = len(prefix)
        depths = []
        for p in PARENTS:
            depths.append(1 if p == -1 else depths[p] + 1)
        mask = torch.cat([torch.ones(len(tokens) + 1, n0, dtype=torch.bool), tree_attention_mask(PARENTS)], 1)
        pos = torch.tensor([[n0] + [n0 + d for d in depths]])
        out.append(decoder(torch.tensor([[root] + tokens]), pos, mask[None, None], cache))
        kv.keep_positions(cache, n0, [0, 2, 6])                       # root, node 1, node 5
        out.append(decoder(torch.tensor([[40]]), torch.tensor([[n0 + 3]]), None, cache))
        n1 = n0 + 4
        chain = torch.ones(3, n1 + 3, dtype=torch.bool).tril(n1)[None, None]
        out.append(decoder(torch.tensor([[41, 42, 43]]), torch.arange(n1, n1 + 3)[None], chain, cache))
    keys = [layer.keys.clone() for layer in cache.layers]
    return out, keys


@pytest.mark.parametrize("cache_kind,dtype", [("dynamic", torch.float32), ("preallocated", torch.float32),
                                             ("preallocated", torch.bfloat16)])
def test_fused_decoder_equals_transformers_bit_for_bit(cache_kind, dtype):
    # bfloat16: transformers rounds the normalised input before the RMSNorm weight product and
    # F.rms_norm does not, so the fused path must use the norm module there (fails otherwise)
    target = tiny_target(seed=3)
    model = target.model.to(dtype)
    with torch.no_grad():                      # norm weights of ones would hide a rounding difference
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    make = (lambda: DynamicCache(config=model.config)) if cache_kind == "dynamic" else \
        (lambda: kv.preallocated_cache(model, 8))                       # starts small: grows
    prefix, root, tokens = [5, 6, 7, 8, 9], 11, [20, 21, 22, 23, 24, 25, 26]
    sequence = torch.tensor([prefix + [root, 21, 25, 40]])
    with torch.no_grad():
        logits_before = model(sequence).logits
    ref_out, ref_keys = steps(fused.DecoderForward(model), model, prefix, root, tokens, make())

    assert fused.supports(model) is None
    decoder = fused.FusedLlamaDecoder(model)
    out, keys = steps(decoder, model, prefix, root, tokens, make())
    for a, b in zip(out, ref_out):
        assert torch.equal(a, b), (a - b).abs().max()
    for a, b in zip(keys, ref_keys):
        assert torch.equal(a, b)

    # the separate projections are now row views of the fused weights: no extra memory, and
    # transformers' own forward (prefill, generate) computes exactly what it did before
    attn = model.model.layers[0].self_attn
    qkv = decoder.layers[0]["qkv"]
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert attn.k_proj.weight.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    with torch.no_grad():
        assert torch.equal(model(sequence).logits, logits_before)


def test_engine_uses_fused_decoder_once_per_target(tiny_models):
    target, head = tiny_models[0]
    a, b = Engine(target, head), Engine(target, head)
    assert isinstance(a.decoder, fused.FusedLlamaDecoder) and a.decoder is b.decoder


@pytest.mark.slow
def test_fused_decoder_equals_transformers_on_the_embedded_model(embedded_target):
    model = embedded_target.model
    ids = embedded_target.tokenizer("The quick brown fox jumps over the lazy dog. It")["input_ids"]
    reference = fused.DecoderForward(model)
    # the eager fused forward (the fast one has its own kernels: tests/test_rowwise.py), made
    # first: it turns the model's q/k/v and gate/up weights into row views of its fused ones,
    # and MKL's one-row product may round differently on another buffer of the same values
    # (the reference's one-token step differed in the last bits before and after fusing on a
    # Zen 5 EPYC; with MKL_CBWR=COMPATIBLE they agree), so both sides read the same memory
    decoder = fused.FusedLlamaDecoder(model)
    ref_out, ref_keys = steps(reference, model, ids[:-1], ids[-1], [314, 253, 1029, 2017, 30, 411, 5229],
                              kv.preallocated_cache(model, 64))
    out, keys = steps(decoder, model, ids[:-1], ids[-1],
                      [314, 253, 1029, 2017, 30, 411, 5229], kv.preallocated_cache(model, 64))
    for a, b in zip(out, ref_out):
        assert torch.equal(a, b), (a - b).abs().max()
    for a, b in zip(keys, ref_keys):
        assert torch.equal(a, b)


def test_unsupported_architecture_runs_transformers_forward_and_stays_lossless():
    """A Llama with projection biases is not what the fused decoder computes: the engine
    must say so and fall back, and greedy decoding must still equal generate()."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      attention_bias=True, bos_token_id=1, eos_token_id=None, pad_token_id=0,
                      tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    target = Target(model=model, tokenizer=tiny_tokenizer(256), name="tiny-bias",
                    device=torch.device("cpu"), dtype=torch.float32)
    assert "bias" in fused.supports(model)
    engine = Engine(target, random_head(target))
    assert type(engine.decoder) is fused.DecoderForward and engine.decoder.fallback_reason
    prompt = [5, 17, 33, 90, 4]
    events = list(engine.generate(prompt_ids=prompt, tree=TreeConfig(method="dynamic", depth=3, top_k=4,
                                                                       total_tokens=8),
                                  sampling=SamplingConfig(), max_new_tokens=24))
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):]
    assert [t for e in events[:-1] for t in e.new_tokens] == expected.tolist()


def test_look_alike_architectures_are_not_fused():
    """Gemma has the same projections but scales its embeddings inside the model's forward:
    the allow-list keeps it (and any other look-alike) on transformers' forward."""
    from transformers import GemmaConfig, GemmaForCausalLM

    cfg = GemmaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, hidden_act="silu",
                      hidden_activation="silu")
    cfg._attn_implementation = "sdpa"
    reason = fused.supports(GemmaForCausalLM(cfg))
    assert reason and "GemmaDecoderLayer" in reason
