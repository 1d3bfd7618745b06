"""Engine rules that only a structure or distribution check catches (output can stay right
while they are broken): Medusa head k drafts depth k, an adaptive run's records name the tree
that was drafted, the sampler's top-p / top-k shaping holds for every emitted token, EAGLE's
sampling is exact away from temperature 1, and a dynamic tree's first level holds
min(top_k, total_tokens) nodes. Tiny real models, CPU."""
from __future__ import annotations

import pytest
import torch

from app.engine.adapt import TreeAdapter, chain
from app.engine.config import SamplingConfig, TreeConfig
from app.engine.engine import Engine
from app.engine.verify import logits_to_probs, rule_for
from tests.test_drafters import run
from tests.test_sampling import E2E_PROMPT, chi_square, exact_joint


def test_medusa_head_k_drafts_depth_k(engines):  # noqa: F811
    """At every depth d of every step's tree, the tokens are among head d's top candidates on
    the feature before the root, and the most confident node is head d's argmax (a proposal
    placed a level too deep keeps the output right but loses most deep acceptances)."""
    engine = engines[0]
    target, heads = engine.target, engine.medusa
    prompt = [7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8, 9]
    cfg = TreeConfig(method="medusa", depth=3, total_tokens=24)
    steps, _ = run(engine, prompt, cfg, n=30)
    committed = list(prompt) + steps[0].new_tokens
    deep = 0
    for s in steps[1:]:
        with torch.no_grad():
            feature = target.model.model(torch.tensor([committed])).last_hidden_state[0, -2]    # (H,)
            logits = heads(feature, cfg.depth)                                                   # (depth, V)
        for d in range(1, cfg.depth + 1):
            nodes = [i for i in range(len(s.tree)) if s.tree.depths[i] == d]
            if not nodes:
                continue
            top = set(torch.topk(logits[d - 1], 8).indices.tolist())
            assert {s.tree.tokens[i] for i in nodes} <= top, (s.step, d)
            best = max(nodes, key=lambda i: (s.tree.q[i], -i))
            assert s.tree.tokens[best] == int(logits[d - 1].argmax()), (s.step, d)
            deep += d > 1
        committed += s.new_tokens
    assert deep >= 10


def test_a_sampled_adaptive_run_records_the_tree_it_drafted(tiny):
    """A sampled run long enough for the adapter to explore (every candidate, then a refresh
    every step) between sampled chains and top-k trees: each step's rule is the rule of
    its tree_config, and its tree has that config's shape (a rule that follows a tree chosen
    after drafting verifies one tree by another's rule)."""
    target, head = tiny
    engine = Engine(target, head)
    # a refresh picks the best's neighbour on one side, then on the other: vanilla (the best on
    # the tiny model, where a step costs little) sits between a top-k tree and a chain, and
    # shapes alternate, so that a second choice differs from the first
    candidates = [chain(1), TreeConfig(method="dynamic", depth=2, top_k=4, total_tokens=6), TreeConfig(method="vanilla"),
                  chain(3), TreeConfig(method="dynamic", depth=3, top_k=2, total_tokens=5), chain(2)]
    seen = set()
    for seed in range(3):
        sampling = SamplingConfig(temperature=1.0, seed=seed)
        adapter = TreeAdapter(candidates, explore_every=1)
        *steps, summary = engine.generate(prompt_ids=[5, 17, 33, 90, 4], tree=chain(1), max_new_tokens=60,
                                          sampling=sampling, adapt=adapter)
        assert len(adapter.switches) >= 4                         # it explored
        for s in steps[1:]:
            cfg = TreeConfig(**{k: v for k, v in s.tree_config.items() if k != "q"}) if s.tree_config else None
            assert s.rule == rule_for(cfg, sampling), (s.step, s.rule, s.tree_config)
            if cfg is None:
                assert s.tree is None
                seen.add("vanilla")
                continue
            depths = s.tree.depths
            room = cfg.top_k + (cfg.depth - 1) * cfg.top_k ** 2      # every level full (tiny vocabulary: 256)
            assert len(s.tree) == min(cfg.total_tokens, room), (s.step, s.tree_config, depths)
            assert max(depths) <= cfg.depth and depths.count(1) <= min(cfg.top_k, cfg.total_tokens)
            if cfg.top_k == 1:                                    # a chain: one node per level
                assert depths == list(range(1, len(depths) + 1)), (s.step, depths)
            seen.add(s.rule)
    assert seen == {"vanilla", "sampled_chain", "sampled_tree"}, seen


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0, top_p=0.5),
                                      SamplingConfig(temperature=0.8, top_k_sampling=3),
                                      SamplingConfig(temperature=1.3, top_p=0.6, top_k_sampling=5)],
                         ids=["top_p", "top_k", "both"])
@pytest.mark.parametrize("tree", [TreeConfig(method="dynamic", depth=3, top_k=4, total_tokens=10), chain(3),
                                  TreeConfig(method="vanilla")], ids=["tree", "chain", "vanilla"])
def test_shaped_sampling_never_emits_a_token_outside_the_support(tiny, sampling, tree):
    """Every emitted token (accepted drafts and bonus tokens alike) has a non-zero probability
    under the target's distribution shaped by temperature, top-k and top-p at its position."""
    target, head = tiny
    engine = Engine(target, head)
    prompt = [5, 17, 33, 90, 4]
    outside = total = accepted = 0
    for seed in range(5):
        *steps, summary = engine.generate(prompt_ids=prompt, tree=tree, max_new_tokens=40,
                                          sampling=SamplingConfig(**{**sampling.__dict__, "seed": seed}))
        ids = summary.token_ids
        accepted += sum(len(s.accepted) for s in steps)
        with torch.no_grad():
            logits = target.model(torch.tensor([prompt + ids])).logits[0]                    # (m + n, V)
        p = logits_to_probs(logits[len(prompt) - 1: len(prompt) - 1 + len(ids)], sampling)   # row i predicts ids[i]
        outside += int((p[torch.arange(len(ids)), torch.tensor(ids)] == 0).sum())
        total += len(ids)
    assert total >= 100 and outside == 0, (outside, total)
    assert tree.method == "vanilla" or accepted > 0           # drafts were accepted too, not only bonus tokens


TREE_OF_CANDIDATES = TreeConfig(method="dynamic", depth=1, top_k=2, total_tokens=2)
SAMPLED_CHAIN = TreeConfig(method="dynamic", depth=1, top_k=1, total_tokens=1)


@pytest.mark.parametrize("tree, temperature", [(TREE_OF_CANDIDATES, 2.5), (SAMPLED_CHAIN, 0.3), (SAMPLED_CHAIN, 2.5)],
                         ids=["tree-of-candidates-2.5", "sampled-chain-0.3", "sampled-chain-2.5"])   # at 0.3 the tree
# of candidates has every draft accepted: nothing to test
def test_eagle_sampling_is_exact_away_from_temperature_one(peaked, tree, temperature):  # noqa: F811
    """The first two tokens of 800 seeded runs at a temperature far from 1 against the exact
    joint at that temperature (chi-square, as test_sampling's test at 1): a q or p tempered
    differently from the draws is exact at 1 and only there (the head's q for min(1, p/q)
    left at temperature 1 passes at 0.6 and fails at 0.3 and 2.5)."""
    target, head = peaked
    engine = Engine(target, head)
    runs = 800
    counts: dict = {}
    drafted = accepted = 0
    for seed in range(runs):
        *steps, summary = engine.generate(prompt_ids=E2E_PROMPT, tree=tree, max_new_tokens=2,
                                          sampling=SamplingConfig(temperature=temperature, seed=seed))
        key = tuple(summary.token_ids)
        counts[key] = counts.get(key, 0) + 1
        if len(steps) > 1:
            drafted += 1
            accepted += len(steps[1].accepted)
    stat, threshold = chi_square(counts, exact_joint(target, E2E_PROMPT, engine.eos_ids, temperature), runs)
    assert stat < threshold, (stat, threshold)
    assert 0.1 < accepted / drafted < 1, accepted / drafted    # both the accept and the reject path ran


@pytest.mark.parametrize("top_k, total_tokens", [(1, 1), (3, 2), (3, 3), (4, 10), (8, 5), (6, 256)])
def test_a_dynamic_trees_first_level_holds_min_top_k_total_tokens(tiny, top_k, total_tokens):
    """A one-level dynamic tree is the root's top_k children cut to total_tokens: exactly
    min(top_k, total_tokens) nodes, every step; with room for every candidate, a deeper
    tree's levels hold top_k, then top_k x top_k (the top_k best are expanded) nodes."""
    target, head = tiny
    engine = Engine(target, head)
    *steps, _ = engine.generate(prompt_ids=[5, 17, 33, 90, 4], max_new_tokens=12,
                                tree=TreeConfig(method="dynamic", depth=1, top_k=top_k, total_tokens=total_tokens))
    assert all(s.tree.depths.count(1) == min(top_k, total_tokens) for s in steps[1:])
    *steps, _ = engine.generate(prompt_ids=[5, 17, 33, 90, 4], max_new_tokens=12,
                                tree=TreeConfig(method="dynamic", depth=3, top_k=3, total_tokens=256))
    assert all([s.tree.depths.count(d) for d in (1, 2, 3)] == [3, 9, 9] for s in steps[1:])
