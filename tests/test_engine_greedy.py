"""Greedy speculative decoding is exactly greedy decoding: every policy, token for token."""
from __future__ import annotations

import pytest
import torch

from app.engine.config import SamplingConfig, TreeConfig
from app.engine.spec import HEAD_METHODS
from app.engine.engine import Engine
from tests.tiny import random_head

PROMPTS = ([5, 17, 33, 90, 4], [7, 7, 7, 100, 200, 31, 9, 12], [3, 250])


def hf_greedy(target, prompt, n):
    out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def run(engine, prompt, tree, n=40, sampling=SamplingConfig()):
    events = list(engine.generate(prompt_ids=prompt, tree=tree, sampling=sampling, max_new_tokens=n))
    return events[:-1], events[-1]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("method", ("vanilla",) + HEAD_METHODS)   # the other drafters: tests/test_drafters.py
def test_every_policy_matches_hf_generate(tiny_models, seed, method):
    target, head = tiny_models[seed]
    engine = Engine(target, head)
    tree = TreeConfig(method=method, depth=4, top_k=4, total_tokens=12)
    for prompt in PROMPTS:
        steps, summary = run(engine, prompt, tree)
        assert summary.token_ids == hf_greedy(target, prompt, 40)
        assert steps[0].prefill and not any(s.prefill for s in steps[1:])
        assert summary.target_forwards == len(steps) - 1     # decoding forwards: the prefill is not one
    if method != "vanilla":
        # the trained head must actually get drafts accepted, or this test proves little
        assert summary.mean_accepted > 1.2


def test_random_head_is_still_lossless(tiny_models):
    target, _ = tiny_models[1]
    engine = Engine(target, random_head(target, seed=5))
    for prompt in PROMPTS:
        _, summary = run(engine, prompt, TreeConfig(method="dynamic", depth=3, top_k=5, total_tokens=20))
        assert summary.token_ids == hf_greedy(target, prompt, 40)


@pytest.mark.parametrize("cfg", [
    dict(depth=1, top_k=1, total_tokens=1),
    dict(depth=1, top_k=8, total_tokens=2),       # the 2-3 row trees whose LM head runs on every row
    dict(depth=2, top_k=1, total_tokens=2),
    dict(depth=6, top_k=2, total_tokens=64),
    dict(depth=3, top_k=8, total_tokens=5, min_confidence=0.2),
    dict(method="threshold", tau_high=0.9, tau_low=0.3),
    dict(method="static", static_shape=((0,), (0, 0), (0, 0, 0), (1,), (1, 0))),
])
def test_knob_extremes_stay_lossless(tiny, cfg):
    target, head = tiny
    engine = Engine(target, head)
    tree = TreeConfig(**{"method": "dynamic", **cfg})
    for prompt in PROMPTS[:2]:
        _, summary = run(engine, prompt, tree, n=30)
        assert summary.token_ids == hf_greedy(target, prompt, 30)


def test_one_token_prompt(tiny):
    """A one-token prompt: the prefill gives the first token, and drafting starts at once."""
    target, head = tiny
    steps, summary = run(Engine(target, head), [42], TreeConfig(), n=20)
    assert summary.token_ids == hf_greedy(target, [42], 20)
    assert steps[0].prefill and steps[0].tree is None and len(steps[1].tree.tokens) > 0


def test_a_prompt_encoded_once_runs_as_its_text(tiny):
    """``generate(prompt_ids=encode_prompt(text))`` (how the page runs a request it checked)
    decodes exactly what ``generate(text)`` does; a prompt given both ways is refused."""
    target, head = tiny
    engine = Engine(target, head)
    text, tree = "w5 w17 w33 w90", TreeConfig(method="dynamic", depth=3, top_k=2, total_tokens=4)
    ids = tuple(engine.encode_prompt(text))
    *_, by_text = engine.generate(text, tree=tree, max_new_tokens=16)
    *_, by_ids = engine.generate(prompt_ids=ids, tree=tree, max_new_tokens=16)
    assert by_ids.token_ids == by_text.token_ids
    with pytest.raises(ValueError, match="not both"):
        engine.generate(text, prompt_ids=ids, tree=tree, max_new_tokens=16)


def test_records_are_consistent(tiny):
    target, head = tiny
    steps, summary = run(Engine(target, head), PROMPTS[0], TreeConfig(depth=4, top_k=4, total_tokens=12), n=40)
    assert [s.step for s in steps] == list(range(len(steps)))
    first = steps[0]
    assert first.prefill and first.tree is None and first.tree_config is None and first.drafter is None
    assert first.new_tokens == [first.bonus] and first.accepted == []
    for s in steps[1:]:
        assert not s.prefill and s.rule == "greedy" and s.drafter == "eagle2"
        assert s.tree_config == {"method": "dynamic", "depth": 4, "top_k": 4, "total_tokens": 12}
        t = s.tree
        n = len(t.tokens)
        assert n <= 12
        assert len(t.texts) == len(t.parents) == len(t.depths) == len(t.q) == len(t.confidence) == len(t.p) == len(t.status) == n
        assert t.texts == [target.tokenizer.decode([tok]) for tok in t.tokens]     # each node's token alone
        for i, par in enumerate(t.parents):
            assert par < i
            assert t.depths[i] == (1 if par == -1 else t.depths[par] + 1)
            parent_conf = 1.0 if par == -1 else t.confidence[par]
            assert t.confidence[i] == pytest.approx(parent_conf * t.q[i])
        accepted_nodes = [i for i, st in enumerate(t.status) if st == "accepted"]
        assert [t.tokens[i] for i in accepted_nodes] == s.accepted
        assert s.new_tokens == s.accepted + [s.bonus] or s is steps[-1]
        # the accepted path is a chain from the root
        for a, b in zip(accepted_nodes, accepted_nodes[1:]):
            assert t.parents[b] == a
        if accepted_nodes:
            assert t.parents[accepted_nodes[0]] == -1
        # rejected = children of reached nodes that were not accepted
        reached = {-1, *accepted_nodes}
        for i, st in enumerate(t.status):
            if st == "rejected":
                assert t.parents[i] in reached
            if st == "unreached":
                assert t.parents[i] not in reached
        # greedy: the bonus is not any reached child's token... unless it equals a rejected sibling's? never:
        last = accepted_nodes[-1] if accepted_nodes else -1
        assert s.bonus not in [t.tokens[i] for i, par in enumerate(t.parents) if par == last]
    assert summary.new_tokens == sum(len(s.new_tokens) for s in steps)
    decoded = summary.new_tokens - len(first.new_tokens)        # the rates leave the prefill out
    assert summary.target_forwards == len(steps) - 1
    assert summary.mean_accepted == pytest.approx(decoded / (len(steps) - 1))
    assert summary.seconds == pytest.approx(sum(s.step_ms for s in steps[1:]) / 1000)
    assert "".join(s.text for s in steps) == summary.text


def test_stops_at_eos_and_max_new_tokens():
    """EOS as the target's own token (vanilla, and the bonus of a tree step): the answer ends
    right after it, EOS included (as transformers does)."""
    from tests.tiny import tiny_target, trained_head

    # an EOS id the model emits early: pick the 3rd greedy token of a prompt as "EOS"
    probe = tiny_target(0)
    prompt = PROMPTS[0]
    ref = hf_greedy(probe, prompt, 10)
    eos = ref[2]
    target = tiny_target(0, eos=eos)
    head = trained_head(target, 0, steps=50, seqs=8)
    for method in ("vanilla", "dynamic", "chain"):
        _, summary = run(Engine(target, head), prompt, TreeConfig(method=method), n=40)
        assert summary.token_ids == ref[:3]  # stops right after EOS, EOS included (as HF does)


def _accepted_inside(step) -> list[int]:
    """The tokens of a step that were accepted draft tokens followed by more accepted ones (not
    the last accepted token, not the bonus)."""
    return step.accepted[:-1]


def test_an_eos_accepted_inside_the_tree_ends_the_answer_there(tiny):
    """The head drafts a token, the target accepts it and a child after it: if that token is
    EOS, nothing after it may be output. The EOS id is chosen from a run so that its first
    occurrence is such an inner accepted token (the same weights with another eos id draft and
    verify identically up to there); the answer must be plain greedy decoding cut at it."""
    from tests.tiny import tiny_target

    target, head = tiny                                       # eos id 2, which this prompt never reaches
    tree = TreeConfig(method="dynamic", depth=5, top_k=4, total_tokens=16)
    prompt = PROMPTS[1]
    steps, summary = run(Engine(target, head), prompt, tree, n=60)
    first_at = {}
    for i, t in enumerate(summary.token_ids):
        first_at.setdefault(t, i)
    out = 0
    candidates = []
    for s in steps:
        for j, t in enumerate(s.new_tokens):
            if j < len(_accepted_inside(s)) and first_at[t] == out + j:
                candidates.append(t)
        out += len(s.new_tokens)
    assert candidates, "no token is first seen accepted inside a tree: the test would prove nothing"
    eos = candidates[0]
    with_eos = tiny_target(0, eos=eos)
    steps_e, summary_e = run(Engine(with_eos, head), prompt, tree, n=60)
    cut = summary.token_ids[: first_at[eos] + 1]
    assert summary_e.token_ids == cut == hf_greedy(with_eos, prompt, 60)
    last = steps_e[-1]
    assert last.new_tokens[-1] == eos and len(last.tree.status) and last.tree.status.count("accepted") > \
        last.new_tokens.index(eos) + 1          # the tree accepted more after EOS: the cut was needed


def test_an_accepting_head_never_overshoots_max_new_tokens(tiny):
    """With a head whose drafts are accepted several at a time, a step could commit more
    tokens than the budget left: the answer must have exactly max_new_tokens tokens (plain
    greedy's first ones), and for some budgets a step's accepted path must have been cut."""
    target, head = tiny
    prompt = PROMPTS[0]
    ref = hf_greedy(target, prompt, 24)
    cut = 0
    for n in range(1, 25):
        steps, summary = run(Engine(target, head), prompt, TreeConfig(method="dynamic", depth=5, top_k=4,
                                                                      total_tokens=16), n=n)
        assert summary.token_ids == ref[:n] and summary.new_tokens == n
        last = steps[-1]
        if last.tree is not None and last.tree.status.count("accepted") + 1 > len(last.new_tokens):
            cut += 1
    assert cut >= 3, cut


def test_the_head_reads_each_feature_with_the_next_token(tiny):
    """EAGLE's pairing: the head at position j reads the target's feature f[j] with the token
    x[j+1] that followed it, and its output predicts f[j+1]. Checked directly: at every step,
    the root's children in the tree (tokens and q) must be q's best of the head run from scratch
    over the pairs (f[j], x[j+1]) of the whole committed sequence — f from one plain target
    forward, no cache — whose last output predicts the feature at the root. Pairing a token
    with its own feature (x[j]), or dropping a pair, gives other candidates. (The draft reads
    the head's own weights here, not the default int8, so that its q is the head's.)"""
    target, head = tiny
    engine = Engine(target, head, draft_weights="head")
    tree = TreeConfig(method="dynamic", depth=3, top_k=4, total_tokens=8)
    steps, _ = run(engine, PROMPTS[1], tree, n=24)
    committed = list(PROMPTS[1]) + steps[0].new_tokens
    embed = target.model.get_input_embeddings()
    checked = 0
    for s in steps[1:]:
        x = torch.tensor([committed])                                             # (1, m)
        with torch.no_grad():
            f = target.model.model(x).last_hidden_state                           # (1, m, H): f[j]
            pos = torch.arange(x.shape[1] - 1)[None]
            pred = head(embed(x[:, 1:]), f[:, :-1], pos, None)                    # pairs (f[j], x[j+1])
            q = torch.softmax(target.model.lm_head(pred[0, -1]).float(), -1)     # predicts the root's child
        depth1 = [i for i, d in enumerate(s.tree.depths) if d == 1]    # q's best children the tree kept
        tokens = [s.tree.tokens[i] for i in depth1]
        assert depth1 and set(tokens) == set(torch.topk(q, len(depth1)).indices.tolist())
        assert [s.tree.q[i] for i in depth1] == pytest.approx(q[tokens].tolist(), abs=1e-4)
        committed += s.new_tokens
        checked += 1
    assert checked > 5


@pytest.mark.parametrize("cfg", [dict(depth=1, top_k=8, total_tokens=2), dict(depth=2, top_k=1, total_tokens=2),
                                 dict(depth=4, top_k=4, total_tokens=12)])
def test_recorded_p_is_the_targets_probability(tiny, cfg):
    """Each node's recorded p is the target's softmax probability of its token after its
    parent, checked against a plain forward over the committed text + the node's ancestors.
    Small trees run the LM head on every row in one batch, larger ones on the parents only:
    both must give the same p."""
    target, head = tiny
    prompt = PROMPTS[1]
    steps, _ = run(Engine(target, head), prompt, TreeConfig(**cfg), n=24)
    committed = list(prompt)
    checked = 0
    committed += steps[0].new_tokens        # the prefill's token
    for s in steps[1:]:
        t = s.tree
        for i, par in enumerate(t.parents):
            path = []
            node = par
            while node != -1:
                path.insert(0, t.tokens[node])
                node = t.parents[node]
            with torch.no_grad():
                logits = target.model(torch.tensor([committed + path])).logits[0, -1]
            assert t.p[i] == pytest.approx(torch.softmax(logits.float(), -1)[t.tokens[i]].item(), abs=1e-5)
            checked += 1
        committed += s.new_tokens
    assert checked > len(steps)
