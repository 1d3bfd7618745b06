"""Adapting the tree while decoding (app/engine/adapt.py): the bandit follows measured costs
and acceptance, and output never depends on the tree it picks."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from app.engine.adapt import TreeAdapter, chain, default_candidates
from app.engine.config import SamplingConfig, TreeConfig
from app.engine.engine import Engine
from app.engine.events import StepEvent


def simulate(adapter: TreeAdapter, steps: int, cost_ms, accepted_of, start=None) -> list[str]:
    """Feed the adapter step records whose time is ``cost_ms(tree, step)`` and whose accepted
    length is ``accepted_of(tree, step)``; returns the tree key ("total/depth/top_k") per step."""
    adapter.start(start)
    used = []
    for i in range(steps):
        tree = adapter.next_tree()
        k = min(accepted_of(tree, i), tree.depth) if tree.uses_draft else 0
        event = StepEvent(step=i + 1, method="dynamic", tree=None, accepted=[7] * k, bonus=8,
                          new_tokens=[7] * k + [8], text="", tree_config=tree.shape() if tree.uses_draft else None,
                          step_ms=cost_ms(tree, i))
        adapter.observe(event)
        used.append(adapter._key(tree))
    return used


def deep() -> list[TreeConfig]:
    """The default candidates with chains down to depth 4: room for the bandit to go deep."""
    return default_candidates(max_chain=4)


def nodes(tree) -> int:
    return tree.total_tokens if tree.uses_draft else 0


def always(k):
    return lambda tree, i: k


def test_cheap_trees_go_deep_and_expensive_trees_stay_short():
    # the head's drafts are accepted 3 deep every time; only the cost of a level differs
    flat = simulate(TreeAdapter(deep()), 60, lambda t, i: 20 + 1 * nodes(t), always(3))
    steep = simulate(TreeAdapter(deep()), 60, lambda t, i: 20 + 40 * nodes(t), always(3))
    assert max(set(flat[20:]), key=flat[20:].count) == "3/3/1"      # depth 4 would not add a token
    assert max(set(steep[20:]), key=steep[20:].count) == "vanilla"   # 60 ms for 2 tokens loses to 20 ms for 1
    mid = simulate(TreeAdapter(deep()), 60, lambda t, i: 20 + 12 * nodes(t), always(1))
    assert max(set(mid[20:]), key=mid[20:].count) == "1/1/1"          # 32 ms for 2 tokens: the one-node chain
    # where no draft is ever accepted, every tree only costs: the run falls back to plain decoding
    idle = simulate(TreeAdapter(deep()), 60, lambda t, i: 20 + 40 * nodes(t), always(0))
    assert idle[20:].count("vanilla") > 30


def test_a_change_of_load_moves_the_tree():
    """Halfway through, big trees become expensive (a neighbour takes the cores and multi-token
    forwards suffer most): the adapter leaves the deep chain for a short one."""
    def cost(t, i):
        return 20 + (1 if i < 60 else 60) * nodes(t)
    used = simulate(TreeAdapter(deep(), explore_every=6), 140, cost, always(3))
    before, after = used[30:60], used[100:]
    assert before.count("3/3/1") > 20
    assert after.count("1/1/1") + after.count("vanilla") > 25


def test_a_change_of_text_moves_the_tree():
    """Code then prose: acceptance falls from 3 deep to none; the deep chain stops paying."""
    accepted = lambda t, i: 3 if i < 60 else 0                     # noqa: E731
    used = simulate(TreeAdapter(deep(), explore_every=6), 140, lambda t, i: 20 + 8 * nodes(t), accepted)
    assert used[30:60].count("3/3/1") > 20
    assert used[100:].count("vanilla") > 25          # no draft accepted any more: plain decoding wins


def test_a_chain_step_teaches_every_shorter_chain():
    adapter = TreeAdapter([chain(1), chain(2), chain(4)], prior_tau={"1/1/1": 1.0, "2/2/1": 1.0, "4/4/1": 1.0})
    adapter.start(chain(4))
    for arm in adapter.arms:
        arm.ms = 10.0
    event = StepEvent(step=1, method="dynamic", tree=None, accepted=[1, 2], bonus=3, new_tokens=[1, 2, 3], text="",
                      tree_config=chain(4).shape(), step_ms=10.0)
    adapter.observe(event)
    # 1 + min(2, d) = 2, 3, 3 tokens, each moving its prior (1.0) by the decay, 0.25
    assert [a.tau for a in adapter.arms] == [1.25, 1.5, 1.5]
    assert [a.tau_seen for a in adapter.arms] == [1, 1, 1]


def test_every_candidate_is_tried_and_the_prefill_is_not_timed():
    adapter = TreeAdapter(deep())
    adapter.start(chain(2))
    adapter.observe(StepEvent(step=0, method="dynamic", tree=None, accepted=[], bonus=1, new_tokens=[1], text="",
                              prefill=True, step_ms=500.0))
    assert adapter.steps == 0 and all(a.ms is None for a in adapter.arms)
    # the prefill reads the prompt through the head too, so the first step is a step like any
    # other: it is timed, and the other candidates get their first tries right after it
    used = simulate(adapter, 7, lambda t, i: 30.0 if i == 0 else 10.0, always(0), start=chain(2))
    assert used[0] == "2/2/1" and adapter.arms[2].ms == 30.0
    assert sorted(used) == ["1/1/1", "2/2/1", "3/2/2", "3/3/1", "4/2/2", "4/4/1", "vanilla"]
    with pytest.raises(ValueError, match="candidates"):
        TreeAdapter([])


def test_one_slow_step_or_one_unlucky_step_does_not_bench_a_tree():
    adapter = TreeAdapter([chain(1), chain(2)], prior_tau={"1/1/1": 1.5, "2/2/1": 2.0})
    adapter.start(chain(2))
    for arm in adapter.arms:
        arm.ms = 10.0
    event = StepEvent(step=6, method="dynamic", tree=None, accepted=[], bonus=3, new_tokens=[3], text="",
                      tree_config=chain(2).shape(), step_ms=1000.0)
    adapter.observe(event)
    two = adapter.arms[1]
    assert two.ms == 0.75 * 10.0 + 0.25 * 20.0     # a burst counts as twice the estimate, not 100 times
    assert two.tau == 0.75 * 2.0 + 0.25 * 1.0      # nothing accepted: the estimate moves, it is not replaced
    # the one-node chain learned from the same step (1 token where 1.5 was assumed): 1.75 / 12.5 still beats
    # its 1.375 / 10
    assert adapter.arms[0].tau == 0.75 * 1.5 + 0.25 * 1.0 and adapter.best() == 1


POLICIES = [TreeConfig(method="vanilla"), chain(1), chain(3), TreeConfig(method="dynamic", depth=3, top_k=4, total_tokens=12),
            TreeConfig(method="static"), TreeConfig(method="threshold", tau_high=0.6, tau_low=0.1, depth=4),
            TreeConfig(method="chain", depth=2, top_k=1, total_tokens=2)]


def test_greedy_output_is_vanilla_whatever_the_adapter_picks(tiny):
    """Every policy among the candidates, switching every step: still plain greedy decoding."""
    target, head = tiny
    engine = Engine(target, head)
    for prompt in ([5, 17, 33, 90, 4], [7, 7, 7, 100, 200, 31, 9, 12]):
        *_, vanilla = engine.generate(prompt_ids=prompt, tree=TreeConfig(method="vanilla"), max_new_tokens=40)
        adapter = TreeAdapter(POLICIES, explore_every=1)
        *steps, summary = engine.generate(prompt_ids=prompt, tree=chain(1), max_new_tokens=40, adapt=adapter)
        assert summary.token_ids == vanilla.token_ids
        used = {(s.tree_config or {"method": "vanilla"})["method"] + str((s.tree_config or {}).get("total_tokens", ""))
                for s in steps[1:]}
        assert len(used) >= 4, used                          # it really moved between policies
        assert all((s.tree_config is None) == (s.drafter is None) for s in steps[1:])
        assert any(s.tree_config is None for s in steps[1:]) and any(s.drafter == "eagle2" for s in steps[1:])


def test_sampled_output_is_exact_under_adaptation(tiny):
    """The first two answer tokens of runs whose tree changes every step, between rules (a
    sampled chain verified with min(1, p/q), and a top-k tree verified as fixed candidates),
    against the exact joint computed from the target: the first token comes from the
    prefill, the second from the first speculative step. n = 1200 runs over the 25 likeliest
    pairs: the TV distance's sampling noise is ~0.05 (bound 0.09)."""
    target, head = tiny
    engine = Engine(target, head)
    prompt = [5, 17, 33, 90, 4]
    ctx = prompt + [9]
    with torch.no_grad():
        p2 = torch.softmax(target.model(torch.tensor([ctx])).logits[0, -1], -1)
        exact = {}
        for a in torch.topk(p2, 5).indices.tolist():
            p3 = torch.softmax(target.model(torch.tensor([ctx + [a]])).logits[0, -1], -1)
            for b in torch.topk(p3, 5).indices.tolist():
                exact[(a, b)] = float(p2[a] * p3[b])
    candidates = [chain(2), TreeConfig(method="dynamic", depth=2, top_k=4, total_tokens=6), chain(1)]
    counts: dict = {}
    n = 1200
    rules = set()
    for seed in range(n):
        adapter = TreeAdapter(candidates, explore_every=1)
        *steps, summary = engine.generate(prompt_ids=ctx, tree=candidates[seed % 3], max_new_tokens=3,
                                          sampling=SamplingConfig(temperature=1.0, seed=seed), adapt=adapter)
        rules.update(s.rule for s in steps[1:])
        key = tuple(summary.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - v) for k, v in exact.items())
    assert rules == {"sampled_chain", "sampled_tree"}
    assert tv < 0.09, tv


def test_a_step_without_a_draft_keeps_the_heads_pairs_in_order(tiny):
    """A vanilla step inside a drafting run must not drop the pairs the head has not read: the
    head's cache plus its pending pairs always cover x[0 .. m-2], and the features queued are
    the target's own at those positions."""
    from app.engine import kv

    target, head = tiny
    engine = Engine(target, head)
    vanilla, tree = TreeConfig(method="vanilla"), chain(2)
    run, first = engine._prefill([5, 17, 33, 90, 4], tree, SamplingConfig(), 64, tree)
    generated = list(first.new_tokens)
    for i, cfg in enumerate([vanilla, vanilla, tree, vanilla, tree, tree, vanilla, tree, vanilla, vanilla], start=1):
        ev = engine._step(run, cfg, SamplingConfig(), i, 64, generated)
        generated += ev.new_tokens
        assert kv.cache_length(run.draft_cache) + len(run.pending_tokens) == len(run.tokens) - 1, i
    with torch.no_grad():
        full = target.model.model(input_ids=torch.tensor([run.tokens[:-1]])).last_hidden_state     # (1, m-1, H)
    n = len(run.pending_tokens)
    assert run.pending_tokens == run.tokens[-n:]
    assert torch.allclose(run.pending_features[0], full[0, -n:], atol=1e-4)


def test_every_reason_to_switch_has_words_on_the_page():
    from app.viz.phases import SWITCH_REASONS

    adapter = TreeAdapter(default_candidates(), explore_every=3)
    simulate(adapter, 40, lambda t, i: 20 + 4 * nodes(t), lambda t, i: i % 3)
    reasons = {why for _, _, why in adapter.switches}
    assert {"first try", "highest measured tokens/s", "refresh the most promising other estimate"} <= reasons
    assert reasons <= set(SWITCH_REASONS)


def test_exploration_refreshes_the_little_measured_tree_before_the_often_measured_one():
    adapter = TreeAdapter([chain(1), chain(2), chain(3)], explore_every=5)
    adapter.start(chain(1))
    for arm, (tau, ms, seen) in zip(adapter.arms, [(2.0, 10.0, 30), (1.8, 20.0, 20), (1.6, 20.0, 1)]):
        arm.tau, arm.ms, arm.runs, arm.tau_seen = tau, ms, seen, seen
    adapter.steps = 5
    # chain 2 is measured faster (0.09 against 0.08 tokens per ms) but seen twenty times;
    # chain 3 once: its estimate is the one worth a second look
    assert adapter.next_tree() == chain(3)
    assert adapter.switches[-1][2] == "refresh the most promising other estimate"
    adapter.steps = 6
    assert adapter.next_tree() == chain(1)          # between refreshes, the best estimate runs


def test_plain_decodings_exactly_known_rate_gets_no_exploration_raise():
    adapter = TreeAdapter([TreeConfig(method="vanilla"), chain(1), chain(2)], explore_every=5)
    adapter.start(chain(2))
    for arm, (tau, ms, seen) in zip(adapter.arms, [(1.0, 18.0, 1), (1.3, 25.0, 2), (2.0, 25.0, 30)]):
        arm.tau, arm.ms, arm.runs, arm.tau_seen = tau, ms, seen, seen
    adapter.steps = 5
    # plain decoding was timed once (0.056 tokens/ms), the 1-node chain's acceptance twice
    # (0.052, raised by its uncertainty to 0.067): the refresh goes to the chain, whose
    # estimate may be wrong; plain decoding's 1 token a step is not
    assert adapter.promise(0) == adapter.rate(0)
    assert adapter.next_tree() == chain(1)


def test_trees_beyond_the_verify_forwards_free_rows_are_not_candidates():
    """Under AVX2 a forward over 5 rows reads the weights twice (two register blocks of 4):
    4/2/2 (root + 4 nodes) is left out there; the tuned tree, priced by its measured cost
    curve, stays whatever its size."""
    keys = lambda cands: [TreeAdapter._key(t) for t in cands]            # noqa: E731
    assert "4/2/2" in keys(default_candidates()) and "4/2/2" in keys(default_candidates(free_rows=16))
    four = keys(default_candidates(free_rows=4))
    assert four == ["vanilla", "1/1/1", "2/2/1", "3/2/2"]
    tuned = TreeConfig(method="dynamic", total_tokens=6, depth=3, top_k=2)
    assert "6/3/2" in keys(default_candidates(tuned, free_rows=4))


def test_a_one_node_tuned_tree_is_the_one_node_chain_not_a_second_candidate():
    """A tuned tree of one node (e.g. 1/1/8 on a slow CPU) drafts what the 1-node chain drafts:
    it joins the candidates as that chain, not as a second arm that would split its
    observations, and a run that starts at it starts on the chain."""
    one = TreeConfig(method="dynamic", total_tokens=1, depth=1, top_k=8)
    assert default_candidates(one) == default_candidates()
    assert default_candidates(TreeConfig(method="dynamic", total_tokens=2, depth=1, top_k=8)) != default_candidates()
    adapter = TreeAdapter(default_candidates(one))
    adapter.start(one)
    assert adapter.next_tree() == chain(1)


def test_the_small_trees_do_not_verify_nodes_too_unlikely_to_pay_for_their_row():
    """The default's small EAGLE-2 trees leave out nodes whose confidence (the product of q along
    the path: EAGLE-2's estimate of the chance they are accepted) is below
    ``SMALL_TREE_MIN_CONFIDENCE``; a chain keeps its nodes (a shorter chain learns from it)."""
    from app.engine.adapt import SMALL_TREE_MIN_CONFIDENCE
    from app.engine.tree import grow_tree

    low = SMALL_TREE_MIN_CONFIDENCE / 2

    def propose(tree, frontier, depth):     # the best child q 0.9, the second ``low``, at every node
        return [[0.9, low] for _ in frontier], [[10 * depth + 1, 10 * depth + 2] for _ in frontier]

    by_key = {TreeAdapter._key(t): t for t in default_candidates()}
    for key in ("3/2/2", "4/2/2"):
        grown = grow_tree(by_key[key], propose)
        assert min(grown.confidence) >= SMALL_TREE_MIN_CONFIDENCE and len(grown) == 2, key   # 0.9, 0.81
        assert len(grow_tree(replace(by_key[key], min_confidence=0.0), propose)) == by_key[key].total_tokens
    chain_one = by_key["1/1/1"]
    assert chain_one.min_confidence == 0.0
    assert len(grow_tree(chain_one, lambda tree, frontier, depth: ([[low]], [[5]]))) == 1
