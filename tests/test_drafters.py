"""The drafters the EAGLE papers compare with (prompt lookup, lookahead, Medusa), as methods of
the one engine: lossless under greedy decoding (identical to transformers generate) and
exact under sampling, verified by the same tree-masked forward as EAGLE's trees, with step
records that name their drafter. Plus the Medusa heads' published layout and training."""
from __future__ import annotations

import pytest
import torch

from app.engine.config import SamplingConfig, TreeConfig
from app.engine.drafters import tree_from_sequences
from app.engine.drafters.pld import lookup
from app.engine.engine import Engine
from app.engine.heads.medusa import MedusaHeads
from app.engine.tree import ROOT
from app.train.medusa import medusa_loss
from tests.tiny import medusa_batch
from app.ui.traces import parse_trace, trace_dict, dumps

# the second prompt repeats itself; the third is the first's own greedy loop on seed 0
PROMPTS = ([5, 17, 33, 90, 4], [7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8, 9], [3, 250])
DRAFTERS = ("pld", "lookahead", "medusa")


def hf_greedy(target, prompt, n):
    out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def run(engine, prompt, tree, n=40, sampling=SamplingConfig()):
    events = list(engine.generate(prompt_ids=prompt, tree=tree, sampling=sampling, max_new_tokens=n))
    return events[:-1], events[-1]


# --- pure parts ---------------------------------------------------------------------------------

def test_prompt_lookup_takes_the_longest_ngram_and_the_latest_matches():
    ctx = [1, 2, 3, 9, 1, 2, 3, 8, 7, 2, 3]
    # "2 3" occurs at 1 and 5 (the suffix itself at 9 does not count); latest first
    assert lookup(ctx, 2, 3, 8) == [[8, 7, 2], [9, 1, 2]]
    assert lookup(ctx, 2, 3, 1) == [[8, 7, 2]]
    assert lookup(ctx, 3, 2, 8) == [[8, 7], [9, 1]]    # no earlier "7 2 3": falls back to "2 3"
    assert lookup([4, 5, 6], 3, 4, 8) == []              # nothing repeats
    assert lookup([4, 5, 4], 3, 4, 8) == [[5, 4]]        # a 1-gram match, continuation up to the end


def test_candidates_become_a_trie_with_count_based_q():
    tree, nodes = tree_from_sequences([[8, 7, 2], [8, 7, 5], [9, 1]], total_tokens=10)
    assert tree.tokens == [8, 7, 2, 5, 9, 1]
    assert tree.parents == [ROOT, 0, 1, 1, ROOT, 4]
    assert tree.q == pytest.approx([2 / 3, 1.0, 0.5, 0.5, 1 / 3, 1.0])
    assert tree.confidence == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert nodes == [[0, 1, 2], [0, 1, 3], [4, 5]]
    small, nodes = tree_from_sequences([[8, 7, 2], [9, 1]], total_tokens=4)
    assert small.tokens == [8, 7, 2, 9] and nodes == [[0, 1, 2], [3]]


# --- lossless -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("method", DRAFTERS)
def test_every_drafter_matches_hf_generate(engines, seed, method):
    """Greedy output equals transformers generate, token for token, on every prompt; and the
    drafter must actually get tokens accepted (on the repetitive prompts), or this proves little."""
    engine = engines[seed]
    tree = TreeConfig(method=method, depth=4, top_k=4, total_tokens=16)
    accepted = 0
    for prompt in PROMPTS:
        steps, summary = run(engine, prompt, tree)
        assert summary.token_ids == hf_greedy(engine.target, prompt, 40)
        accepted += sum(len(s.accepted) for s in steps)
        for s in steps[1:]:
            assert s.drafter == method and s.tree_config["method"] == method and s.rule == "greedy"
            assert s.tree is not None
            assert len(s.tree) <= tree.total_tokens and all(d <= tree.max_path for d in s.tree.depths)
    assert accepted >= 10, accepted


@pytest.mark.parametrize("cfg", [
    dict(method="pld", ngram=1, depth=1, top_k=1, total_tokens=1),
    dict(method="pld", ngram=4, depth=10, top_k=8, total_tokens=40),
    dict(method="lookahead", ngram=2, window=1, top_k=1, total_tokens=2),
    dict(method="lookahead", ngram=5, window=8, pool=2, top_k=6, total_tokens=30),
    dict(method="lookahead", ngram=4, window=6, total_tokens=3),       # the window cut to total_tokens
    dict(method="medusa", depth=1, total_tokens=1),
    dict(method="medusa", depth=8, total_tokens=64, static_shape=((0,), (1,), (0, 0), (0, 0, 0), (0, 0, 0, 0))),
])
def test_knob_extremes_stay_lossless(engines, cfg):
    engine = engines[0]
    for prompt in PROMPTS[:2]:
        _, summary = run(engine, prompt, TreeConfig(**cfg), n=30)
        assert summary.token_ids == hf_greedy(engine.target, prompt, 30)


def test_lookahead_collects_jacobi_ngrams_and_gets_them_accepted(engines):
    """On the tiny model's own repeating answer, n-grams of the Jacobi trajectories are the
    source of the accepted tokens that the window's chain alone does not explain."""
    engine = engines[0]
    steps, summary = run(engine, PROMPTS[0], TreeConfig(method="lookahead", ngram=3, window=4, top_k=4,
                                                        total_tokens=16), n=60)
    assert summary.token_ids == hf_greedy(engine.target, PROMPTS[0], 60)
    # a step accepted tokens off the window's chain: those nodes came from the pool
    off_window = [s for s in steps[1:] if s.accepted and any(s.tree.depths[i] == 1 and s.tree.parents[i] == ROOT
                                                            and s.tree.status[i] == "accepted" and i > 0
                                                            for i in range(len(s.tree)))]
    assert off_window
    assert summary.mean_accepted > 1.5


def test_lookahead_jacobi_step_by_hand():
    """Two Jacobi iterations with known target outputs: the window slides to the outputs past
    the committed tokens, and n-grams follow each trajectory back across iterations."""
    from types import SimpleNamespace

    from app.engine.drafters.lookahead import Lookahead

    cfg = TreeConfig(method="lookahead", window=3, ngram=3, top_k=2, total_tokens=10)
    la = Lookahead(cfg, prompt_ids=[50])

    def verified(root, prefix, outputs):        # the verify forward's argmax at each row
        return SimpleNamespace(root=root, prefix=prefix, logits=torch.eye(64)[outputs])

    la.window = [11, 12, 13]
    tree = la.draft(None, SimpleNamespace(tokens=[1, 10]), cfg)
    assert tree.tokens == [11, 12, 13] and tree.parents == [ROOT, 0, 1] and la.window_nodes == [0, 1, 2]
    # iteration 1 at root 10 (position 100): rows root, 11, 12, 13 -> 21, 22, 23, 24; nothing accepted
    la.observe(None, None, verified(10, 100, [21, 22, 23, 24]), tree, [], 21, cfg)
    assert la.window == [22, 23, 24] and la.pool == {}          # N = 3 needs two iterations
    tree = la.draft(None, SimpleNamespace(tokens=[1, 10, 21]), cfg)
    # iteration 2 at root 21 (position 101): -> 31, 32, 33, 34; the guess 22 accepted, bonus 32
    la.observe(None, None, verified(21, 101, [31, 32, 33, 34]), tree, [0], 32, cfg)
    assert la.candidates(10, 2) == [[21, 31]] and la.candidates(11, 2) == [[22, 32]]
    assert la.candidates(13, 2) == [[24, 34]]
    assert la.window[:2] == [33, 34] and la.window[2] == 50      # padded with a prompt token
    tree = la.draft(None, SimpleNamespace(tokens=[1, 10, 21, 22, 32, 13]), cfg)   # root 13: one pool n-gram
    assert tree.tokens == [33, 34, 50, 24, 34] and tree.parents == [ROOT, 0, 1, ROOT, 3]


def test_medusa_reads_the_feature_before_the_root(engines):
    """Each step's depth-1 best node is head 1's argmax on the target's feature at the token
    before the root: recomputed here with a plain forward over the committed tokens."""
    engine = engines[0]
    target, heads = engine.target, engine.medusa
    prompt = PROMPTS[0]
    steps, _ = run(engine, prompt, TreeConfig(method="medusa", depth=3, total_tokens=24), n=30)
    committed = list(prompt) + steps[0].new_tokens
    checked = 0
    for s in steps[1:]:
        with torch.no_grad():
            feature = target.model.model(torch.tensor([committed])).last_hidden_state[0, -2]   # (H,)
            best = int(heads(feature, 1)[0].argmax())
        first = max((i for i in range(len(s.tree)) if s.tree.depths[i] == 1), key=lambda i: s.tree.q[i])
        assert s.tree.tokens[first] == best
        checked += bool(s.accepted)
        committed += s.new_tokens
    assert checked >= 3          # including steps that accepted a path, where the row matters


def test_records_name_their_drafter_and_load_as_a_trace(engines):
    """Step records carry drafter / tree_config / rule for every drafter, and a trace of them
    passes the trace validator (what the page loads)."""
    engine = engines[0]
    for method, extra in (("pld", {"ngram": 3, "q": "count"}),
                          ("lookahead", {"ngram": 3, "window": 4, "pool": 8, "q": "count"}),
                          ("medusa", {})):
        tree = TreeConfig(method=method)
        steps, summary = run(engine, PROMPTS[1], tree, n=12)
        assert steps[0].prefill and steps[0].drafter is None
        assert steps[1].tree_config == {"method": method, "depth": 5, "top_k": 8, "total_tokens": 24, **extra}
        trace = parse_trace(dumps(trace_dict({"method": method}, {"name": "tiny"}, steps, summary)))
        assert [s.drafter for s in trace.steps] == [None] + [method] * (len(steps) - 1)
        assert trace.steps[1].tree_config == steps[1].tree_config


def test_methods_need_only_their_own_drafter(tiny):
    target, head = tiny
    with pytest.raises(ValueError, match="Medusa"):
        Engine(target, head).generate(prompt_ids=[5, 6], tree=TreeConfig(method="medusa"))
    with pytest.raises(ValueError, match="draft head"):
        Engine(target, None).generate(prompt_ids=[5, 6], tree=TreeConfig(method="dynamic"))
    for method in ("pld", "lookahead"):                      # no weights needed at all
        *_, summary = Engine(target, None).generate(prompt_ids=[5, 6], tree=TreeConfig(method=method),
                                                    max_new_tokens=5)
        assert summary.new_tokens == 5
    with pytest.raises(ValueError, match="ngram"):
        TreeConfig(method="lookahead", ngram=1)


# --- sampling is exact --------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["pld", "medusa"])
def test_sampled_drafters_match_the_target(engines, method):
    """The joint distribution of the first two sampled tokens equals the target's (the pattern
    of test_sampling.py), with deterministic candidates verified by sequential_verify. The
    prompt ends in the model's own greedy loop, so pld finds continuations to propose; at
    temperature 0.2 the tiny model's top token has ~0.4 of the mass (at 1.0 it is nearly
    uniform, and no draft would ever be accepted)."""
    engine = engines[0]
    target = engine.target
    prompt = PROMPTS[0] + hf_greedy(target, PROMPTS[0], 30)
    temperature = 0.2
    with torch.no_grad():
        p1 = torch.softmax(target.model(torch.tensor([prompt])).logits[0, -1] / temperature, -1)
        exact = {}
        for a in torch.topk(p1, 6).indices.tolist():
            p2 = torch.softmax(target.model(torch.tensor([prompt + [a]])).logits[0, -1] / temperature, -1)
            for b in torch.topk(p2, 6).indices.tolist():
                exact[(a, b)] = float(p1[a] * p2[b])
    n = 1500
    counts: dict[tuple, int] = {}
    accepted = 0
    tree = TreeConfig(method=method, depth=3, top_k=4, total_tokens=12)
    for seed in range(n):
        *steps, summary = engine.generate(prompt_ids=prompt, tree=tree,
                                          sampling=SamplingConfig(temperature=temperature, seed=seed),
                                          max_new_tokens=2)
        key = tuple(summary.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(len(s.accepted) for s in steps)
        assert all(s.rule == "sampled_tree" for s in steps[1:])
    err = 0.5 * sum(abs(counts.get(k, 0) / n - v) for k, v in exact.items())
    assert err < 0.08, err
    assert accepted > 50, accepted     # the drafts mattered: their tokens were accepted in many runs


# --- Medusa heads: layout and training ---------------------------------------------------------

def test_medusa_layout_round_trips_strictly(tmp_path, tiny):
    target, _ = tiny
    heads = MedusaHeads.from_target(target.model, 3, num_layers=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    heads.save(tmp_path / "full")
    expected = {f"{k}.{l}.linear.{w}" for k in range(3) for l in range(2) for w in ("weight", "bias")} | \
        {f"{k}.2.weight" for k in range(3)}
    assert set(heads.state_dict()) == expected              # the published medusa_lm_head keys
    back = MedusaHeads.load(tmp_path / "full")
    assert back.num_heads == 3 and back.num_layers == 2 and back.vocab_ids is None
    for key, tensor in heads.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key
    # a draft vocabulary: the LM heads hold only its rows, and draft_vocab.json maps them back
    ids = torch.arange(3, 131)
    small = MedusaHeads.from_target(target.model, 2, vocab_ids=ids)
    assert torch.equal(small[1][-1].weight, target.model.lm_head.weight[3:131])
    small.save(tmp_path / "small")
    again = MedusaHeads.load(tmp_path / "small", target_vocab=256)
    assert torch.equal(again.vocab_ids, ids) and again[0][-1].weight.shape == (128, 64)
    # strict: a missing or an extra key is an error naming it; a Medusa-1 .pt file loads the same
    from safetensors.torch import load_file, save_file
    state = load_file(str(tmp_path / "full" / "medusa_lm_head.safetensors"))
    for broken, word in (({k: v for k, v in state.items() if k != "1.0.linear.bias"}, "1.0.linear.bias"),
                         ({**state, "3.0.linear.weight": state["0.0.linear.weight"].clone()}, "3.0.linear.weight")):
        save_file(broken, str(tmp_path / "full" / "medusa_lm_head.safetensors"))
        with pytest.raises(KeyError, match=word.replace(".", r"\.")):
            MedusaHeads.load(tmp_path / "full")
    (tmp_path / "full" / "medusa_lm_head.safetensors").unlink()
    torch.save(state, tmp_path / "full" / "medusa_lm_head.pt")
    legacy = MedusaHeads.load(tmp_path / "full")
    assert all(torch.equal(legacy.state_dict()[k], v) for k, v in state.items())


def test_untrained_heads_start_as_the_targets_next_token_head(tiny):
    """The published initialisation: zero residual blocks and a copy of the target's LM head."""
    target, _ = tiny
    heads = MedusaHeads.from_target(target.model, 2)
    f = torch.randn(5, 64)
    with torch.no_grad():
        assert torch.allclose(heads(f), target.model.lm_head(f).expand(2, -1, -1), atol=1e-6)


def test_a_training_step_reduces_the_loss(tiny):
    target, _ = tiny
    heads = MedusaHeads.from_target(target.model, 3)
    batch = medusa_batch(target, seqs=8, length=24)
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-3)
    with torch.no_grad():
        before, acc_before = medusa_loss(heads, batch)
    for _ in range(5):
        loss, _ = medusa_loss(heads, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after, acc_after = medusa_loss(heads, batch)
    assert float(after) < 0.9 * float(before)
    assert sum(acc_after) > sum(acc_before)
    # the residual blocks (started at zero) learn too, not only the LM heads
    assert all(float(block.linear.weight.detach().abs().sum()) > 0 for head in heads for block in list(head)[:-1])


def test_medusa_training_stage_ships_loadable_heads_and_resumes(tmp_path, monkeypatch):
    """``train --arch medusa`` on feature shards: the heads come out in the published layout
    with their draft vocabulary, load strictly for the target, and a rerun with a larger
    budget resumes from the checkpoint instead of starting over."""
    import argparse
    import json

    from app.engine import loading
    from app.train.medusa import run_medusa_training
    from tests.test_train import _tiny_shard
    from tests.tiny import tiny_target

    target = tiny_target(seed=5)
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    for shard in range(2):
        _tiny_shard(target, shard, n=6, new_tokens=24).save(tmp_path / "features" / f"shard_{shard:05d}.safetensors")
    args = argparse.Namespace(
        base_model=None, run_name="m", holdout=["shard_00001.safetensors"], seed=0, device="cpu",
        medusa_heads=2, medusa_layers=1, epochs=2, batch_tokens=256, lr=3e-3, weight_decay=0.0, warmup_steps=2,
        clip=0.5, checkpoint_every=100, train_minutes=None, loss_vocab="draft", draft_vocab_size=40)
    out = tmp_path / "medusa"
    first = run_medusa_training(args, tmp_path, out)
    assert first["step"] > 0 and len(first["holdout_top1"]) == 2
    heads = loading.load_medusa_heads(str(out), target)
    assert heads.num_heads == 2 and len(heads.vocab_ids) == 40 and heads[0][-1].weight.shape == (40, 64)
    assert json.loads((out / "training.json").read_text())["step"] == first["step"]
    again = run_medusa_training(argparse.Namespace(**{**vars(args), "epochs": 4}), tmp_path, out)
    assert again["step"] == 2 * first["step"]
    engine = Engine(target, None, medusa=heads)
    *_, summary = engine.generate(prompt_ids=[5, 17, 33], tree=TreeConfig(method="medusa"), max_new_tokens=12)
    assert summary.token_ids == hf_greedy(target, [5, 17, 33], 12)
