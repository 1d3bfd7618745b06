"""EAGLE-3 in the engine: the official checkpoint layout, lossless decoding with every tree
policy, and drafts that are exactly what training-time test trained the head to produce.

On a tiny 8-layer Llama (tests/tiny.py: the head reads the inputs of layers 2, 4 and 5).
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.engine.config import SamplingConfig, TreeConfig
from app.engine.engine import Engine
from app.engine.factory import load_engine
from app.engine.loading import load_draft_head
from tests.tiny import eagle3_target, random_eagle3_head, trained_eagle3_head

PROMPT = [5, 17, 33, 90, 4]
POLICIES = ("dynamic", "static", "chain", "threshold")

# the published EAGLE-3 heads' keys (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)
OFFICIAL_KEYS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
}


@pytest.fixture(scope="module")
def target():
    return eagle3_target(0)


@pytest.fixture(scope="module")
def trained(target):
    return trained_eagle3_head(target)


@pytest.fixture
def saved(target, tmp_path):
    """A random EAGLE-3 head saved in the official layout."""
    random_eagle3_head(target).save(tmp_path)
    return tmp_path


def reference(target, n=40):
    return target.model.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False)[0, len(PROMPT):].tolist()


# --- checkpoint layout -------------------------------------------------------------------

def test_saved_in_the_official_layout_and_loaded_strictly_as_eagle3(target, saved):
    assert set(load_file(saved / "model.safetensors")) == OFFICIAL_KEYS
    config = json.loads((saved / "config.json").read_text())
    assert config["draft_vocab_size"] == 197 and config["num_hidden_layers"] == 1
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    engine, _ = load_engine(draft_model=str(saved), target=target)
    assert engine.head.kind == "eagle3" and engine.drafter == "eagle3"
    assert engine.target_layers == (2, 4, 5)
    assert engine.draft_vocab.tolist() == list(range(3, 200))
    original = random_eagle3_head(target)
    for k, v in original.state_dict().items():
        assert torch.equal(v, engine.head.state_dict()[k]), k


def test_a_published_style_checkpoint_loads_from_pytorch_bin(target, saved):
    """Published heads: pytorch_model.bin (read with weights_only), a config written by an
    older transformers (top-level rope_theta, no layer list: the reference's 2, L/2, L-3)."""
    state = load_file(saved / "model.safetensors")
    (saved / "model.safetensors").unlink()
    torch.save(state, saved / "pytorch_model.bin")
    config = json.loads((saved / "config.json").read_text())
    theta = config.pop("rope_parameters")["rope_theta"]
    config.pop("eagle_config")
    config["rope_theta"] = theta
    (saved / "config.json").write_text(json.dumps(config))
    head = load_draft_head(str(saved), target)
    assert head.kind == "eagle3" and head.target_layers == (2, 4, 5)
    assert head.config.rope_parameters["rope_theta"] == theta


@pytest.mark.parametrize("change, match", [
    ("drop", r"missing keys \['midlayer.hidden_norm.weight'\]"),
    ("extra", r"unexpected keys \['midlayer.extra.weight'\]"),
    ("shape", "lm_head.weight has shape"),
    ("d2t", "d2t and t2d do not describe the same"),
    ("t2d", "d2t and t2d do not describe the same"),
    ("no-vocab-size", "no draft_vocab_size"),
])
def test_a_wrong_checkpoint_fails_in_one_line(target, saved, change, match):
    path = saved / "model.safetensors"
    state = load_file(path)
    if change == "drop":
        del state["midlayer.hidden_norm.weight"]
    elif change == "extra":
        state["midlayer.extra.weight"] = torch.ones(3)
    elif change == "shape":
        state["lm_head.weight"] = torch.zeros(5, 64)
    elif change == "d2t":
        state["d2t"] = state["d2t"].clone()
        state["d2t"][0] += 1                     # draft ids 0 and 1 both map to token 4
    elif change == "t2d":
        state["t2d"] = state["t2d"].clone()
        state["t2d"][250] = True                 # a target token no draft id maps to
    else:
        config = json.loads((saved / "config.json").read_text())
        del config["draft_vocab_size"]
        (saved / "config.json").write_text(json.dumps(config))
    save_file(state, str(path))
    with pytest.raises((KeyError, ValueError), match=match):
        load_draft_head(str(saved), target)


def test_a_head_for_another_target_is_named_in_one_line(target, tmp_path):
    from tests.tiny import tiny_target

    random_eagle3_head(tiny_target(0, hidden=32, layers=8)).save(tmp_path / "narrow")
    with pytest.raises(ValueError, match="hidden_size 32, the target has 64"):
        load_draft_head(str(tmp_path / "narrow"), target)
    random_eagle3_head(tiny_target(0, vocab=300, layers=8)).save(tmp_path / "wide")
    with pytest.raises(ValueError, match="vocab_size 300, the target has 256"):
        load_draft_head(str(tmp_path / "wide"), target)
    random_eagle3_head(target).save(tmp_path / "deep")
    with pytest.raises(ValueError, match=r"three target layers in \[0, 2\)"):
        load_draft_head(str(tmp_path / "deep"), tiny_target(0))    # the tiny 2-layer target


# --- the engine ----------------------------------------------------------------------------

def test_fused_verify_forward_returns_the_layers_transformers_computes(target):
    """The verify forward's low/mid/high taps are transformers' hidden_states[i] (the inputs of
    layers i), bit for bit, and the final hidden state is unchanged by asking for them."""
    from app.engine import forward, fused, kv

    ids, pos = torch.tensor([PROMPT]), torch.arange(5)[None]
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        ref = target.model.model(input_ids=ids, output_hidden_states=True)
        expected = torch.cat([ref.hidden_states[i] for i in (2, 4, 5)], -1)
        # the eager fused forward: bit for bit; the engine's (fast where it can run) to rounding
        for forward, exact in ((fused.FusedLlamaDecoder(target.model), True), (forward.decoder_forward(target), False)):
            hidden, taps = forward(ids, pos, causal, kv.preallocated_cache(target.model, 8), (2, 4, 5))
            plain = forward(ids, pos, causal, kv.preallocated_cache(target.model, 8))
            assert torch.equal(hidden, plain)
            if exact:
                assert torch.equal(taps, expected) and torch.equal(hidden, ref.last_hidden_state)
            else:
                torch.testing.assert_close(taps, expected, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(hidden, ref.last_hidden_state, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", POLICIES)
def test_greedy_output_is_generates_for_every_policy(target, saved, trained, method):
    """Random head loaded from the official layout, and a briefly trained one (whose drafts
    get accepted, so accepted paths are committed): output equals transformers' generate; the
    records name the drafter, and every draft is a draft-vocabulary token."""
    ref = reference(target)
    loaded, _ = load_engine(draft_model=str(saved), target=target)
    for engine in (loaded, Engine(target, trained)):
        *steps, summary = engine.generate(prompt_ids=PROMPT, tree=TreeConfig(method=method), max_new_tokens=40)
        assert summary.token_ids == ref
        drafted = [t for s in steps[1:] for t in s.tree.tokens]
        assert drafted and all(3 <= t < 200 for t in drafted)
        assert {s.drafter for s in steps[1:]} == {"eagle3"} and steps[0].drafter is None
    assert sum(len(s.accepted) for s in steps) > 0      # the trained head's drafts are accepted


def test_drafts_are_what_training_time_test_computes(target, trained):
    """Each step's greedy chain (depth 3) equals the argmax chain of the head unrolled as in
    training (app.train.eagle3.ttt_forward) over the committed tokens plus that chain, with the
    target's layers from one plain forward: the engine feeds the head the same layers, positions
    and attention (committed pairs + drafted ancestors) that training-time test trains it on."""
    from app.train.eagle3 import ttt_forward

    # the head's own (float32) weights: on the fast kernels they draft to rounding what the
    # eager head computes, where int8 weights could flip a near-tie of the argmax
    engine = Engine(target, trained, draft_weights="head")
    *steps, summary = engine.generate(prompt_ids=PROMPT, tree=TreeConfig(method="chain", depth=3, top_k=1),
                                      max_new_tokens=30)
    committed = list(PROMPT) + steps[0].new_tokens
    embed = target.model.get_input_embeddings()
    ids = trained.draft_token_ids()
    accepted = 0
    for step in steps[1:]:
        chain = step.tree.tokens
        m = len(committed) - 1                                              # x[m] is the root
        seq = torch.tensor([committed + chain[:-1]])                        # (1, m+1+k-1) x, then the chain
        with torch.no_grad():
            hs = target.model.model(seq[:, :m], output_hidden_states=True).hidden_states
            g = torch.cat([hs[i] for i in trained.target_layers], -1)       # (1, m, 3H) g[j], j < m
            g = torch.cat([g, g.new_zeros(1, len(chain) - 1, g.shape[-1])], 1)   # positions past m-1: unread
            states = list(ttt_forward(trained, embed(seq[:, 1:]), g, len(chain)))
        unrolled = [int(ids[trained.logits(a[0, m - 1]).argmax()]) for a in states]
        assert unrolled == chain, step.step
        committed += step.accepted + [step.bonus]
        accepted += len(step.accepted)
    assert accepted > 0


def test_a_sampled_chain_from_an_eagle3_head_is_verified_by_speculative_sampling(target, trained):
    """Under sampling a one-wide tree is a chain drafted by sampling q and verified by
    min(1, p/q). That rule's output distribution is tested with power in
    tests/test_sampling.py (shared code, app/engine/verify.py); what an EAGLE-3 head changes is
    where q lives (its draft vocabulary), checked by the q test below. A joint-distribution
    test on this tiny target had no power: its answers are near-deterministic, and it still
    passed with every draft accepted."""
    engine = Engine(target, trained)
    *steps, _ = engine.generate(prompt_ids=PROMPT, tree=TreeConfig(method="chain"),
                                sampling=SamplingConfig(temperature=1.0, seed=3), max_new_tokens=30)
    assert {s.rule for s in steps[1:]} == {"sampled_chain"}
    assert any(len(s.accepted) for s in steps[1:])


def test_a_sampled_tree_from_an_eagle3_head_is_verified_by_sequential_rejection(target, trained):
    """Under sampling a dynamic tree's nodes are candidates (verified by the multi-candidate
    rule), drafted as target ids inside the head's draft vocabulary."""
    engine = Engine(target, trained)
    *steps, _ = engine.generate(prompt_ids=PROMPT, tree=TreeConfig(method="dynamic", depth=3, top_k=4, total_tokens=12),
                                sampling=SamplingConfig(temperature=1.0, seed=3), max_new_tokens=30)
    assert {s.rule for s in steps[1:]} == {"sampled_tree"}
    allowed = set(trained.draft_token_ids().tolist())
    assert all(set(s.tree.tokens) <= allowed for s in steps[1:] if s.tree is not None)
    assert any(len(s.accepted) for s in steps[1:])


def test_every_tensor_is_made_on_the_models_device(target, trained):
    """GPU readiness without a GPU (as in tests/test_sampling.py): with torch's default device
    'meta', every step comes out as with the default left alone."""
    engine = Engine(target, trained)
    for tree, sampling in ((TreeConfig(method="dynamic", depth=3, top_k=4, total_tokens=8), SamplingConfig()),
                           (TreeConfig(method="chain"), SamplingConfig(temperature=1.0, seed=1))):
        plain = list(engine.generate(prompt_ids=PROMPT, tree=tree, sampling=sampling, max_new_tokens=16))
        torch.set_default_device("meta")
        try:
            meta = list(engine.generate(prompt_ids=PROMPT, tree=tree, sampling=sampling, max_new_tokens=16))
        finally:
            torch.set_default_device(None)
        assert [e.new_tokens for e in meta[:-1]] == [e.new_tokens for e in plain[:-1]]
        assert [e.tree for e in meta[:-1]] == [e.tree for e in plain[:-1]]


def test_an_eagle3_head_takes_no_second_draft_vocabulary(target, trained):
    with pytest.raises(ValueError, match="its own vocabulary"):
        Engine(target, trained, draft_vocab=torch.arange(3, 100))


def test_the_page_runs_an_eagle3_engine_unchanged(target, trained):
    """The Gradio handlers (no server) stream, draw trees and race an EAGLE-3 engine as they do
    an EAGLE-2 one: lossless against the vanilla run, every tree step drafted by "eagle3"."""
    from app.ui import handlers
    from app.ui.session import Session
    from app.ui.settings import AppContext, ServerConfig

    ctx = AppContext(Engine(target, trained), ServerConfig(max_new_tokens=64, max_prompt_chars=200,
                                                           update_interval_s=0.0), "tiny eagle3")
    session = Session()
    views = list(handlers.generate(ctx, session, prompt="w5 w17 w33 w90", method="dynamic", max_new_tokens=24,
                                   temperature=0.0, depth=4, top_k=4, total_tokens=12))
    assert sum("tree" in v for v in views) >= 3 and "identical" in views[-1]["speedup"]
    assert session.summary.token_ids == session.race_vanilla.summary.token_ids
    assert {s.drafter for s in session.steps if not s.prefill} == {"eagle3"}


def test_a_sampled_chain_is_verified_with_the_q_its_drafts_were_drawn_from(target, trained, monkeypatch):
    """Speculative sampling is exact only if the verifier's q (over the full vocabulary) gives
    each drafted token the probability it was drawn with from the head's draft-vocabulary q.
    The spy passes every call through to the real chain_verify."""
    from app.engine import verify

    seen = []
    real = verify.chain_verify

    def spy(p, draft_q, tokens, generator):
        seen.append((draft_q.clone(), list(tokens)))
        return real(p, draft_q, tokens, generator)

    monkeypatch.setattr(verify, "chain_verify", spy)
    *steps, _ = Engine(target, trained).generate(prompt_ids=PROMPT, tree=TreeConfig(method="chain", depth=3),
                                                 sampling=SamplingConfig(temperature=1.0, seed=5), max_new_tokens=20)
    trees = [s.tree for s in steps[1:]]
    assert len(seen) == len(trees) > 0
    outside = torch.ones(256, dtype=torch.bool)
    outside[3:200] = False
    for (q, tokens), tree in zip(seen, trees):
        assert tokens == tree.tokens
        for i, t in enumerate(tokens):
            assert float(q[i, t]) == pytest.approx(tree.q[i], rel=1e-6)
        torch.testing.assert_close(q.sum(-1), torch.ones(len(tokens)))
        assert float(q[:, outside].abs().sum()) == 0.0
