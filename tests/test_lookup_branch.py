"""Prompt lookup beside the EAGLE head (``TreeConfig.lookup``): what followed the context's last
n-gram is verified as one more branch of the head's tree. The index answers like a scan of the
whole context, the branch shares the head's nodes where they agree, greedy output stays that
of plain decoding, sampling stays exact, and the records and the page tell the branch apart."""
from __future__ import annotations

import random

import pytest
import torch

from app.bench.runners import parse_methods
from app.engine.adapt import (AUTO_LOOKUP, WIDE_LOOKUP, WIDEST_LOOKUP, TreeAdapter, adapter_for, auto_lookup,
                              chain)
from app.engine.config import SamplingConfig, TreeConfig
from app.engine.drafters.pld import NgramIndex, lookup
from app.engine.engine import Engine
from app.engine.events import DraftTreeRecord, StepEvent
from app.engine.tree import ROOT, DraftTree
from app.ui.traces import TraceError, dumps, parse_trace, trace_dict
from app.viz.style import LOOKUP_FILL
from app.viz.tree import tree_figure
from tests.test_sampling import chi_square, exact_joint
from tests.tiny import random_head

# the first prompt repeats itself, so the context's last n-grams occurred before
PROMPTS = ([7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8, 9], [5, 17, 33, 90, 4, 5, 17, 33])


def hf_greedy(target, prompt, n):
    out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def scan(tokens: list[int], length: int) -> list[int]:
    """The reference: pld's scan of the whole context, n = 3 then 2, the latest match."""
    for n in (3, 2):
        if len(tokens) > n:
            m = len(tokens)
            for i in range(m - n - 1, -1, -1):
                if tokens[i:i + n] == tokens[m - n:]:
                    return tokens[i + n:i + n + length]
    return []


def test_the_index_answers_like_a_scan_of_the_whole_context_as_it_grows():
    rng = random.Random(0)
    for trial in range(20):
        tokens: list[int] = []
        index = NgramIndex((3, 2))
        for _ in range(300):
            tokens.extend(rng.randrange(6) for _ in range(rng.randrange(1, 4)))   # a step commits 1-3 tokens
            assert index.lookup(tokens, 4) == scan(tokens, 4), tokens
    # the same question the pld drafter asks, where n >= 2 matched
    ctx = [1, 2, 3, 9, 1, 2, 3, 8, 7, 2, 3]
    assert NgramIndex((3, 2)).lookup(ctx, 3) == lookup(ctx, 3, 3, 1)[0] == [8, 7, 2]
    assert NgramIndex((3, 2)).lookup([4, 5, 4], 3) == []       # a 1-gram match is no evidence here
    with pytest.raises(ValueError, match="sizes"):
        NgramIndex(())


def test_the_branch_follows_the_heads_nodes_and_adds_its_own_after_them():
    tree = DraftTree()
    a = tree.add(ROOT, 10, 0.6, 0)
    b = tree.add(ROOT, 20, 0.3, 1)
    c = tree.add(a, 11, 0.5, 0)
    nodes = tree.merge_branch([10, 11, 12, 13], "pld", max_nodes=10)
    assert nodes[:2] == [a, c] and nodes[2:] == [3, 4]        # shares "10 11", then its own
    assert tree.parents[3:] == [c, 3] and tree.depths[3:] == [3, 4]
    assert tree.sources == [None, None, None, "pld", "pld"] and tree.q[3:] == [1.0, 1.0]
    assert tree.merge_branch([20, 5], "pld", max_nodes=6) == [b, 5]      # cut at the cap
    assert len(tree) == 6 and tree.parents[5] == b
    assert tree.merge_branch([20, 5, 6], "pld", max_nodes=6) == [b, 5]  # nothing past max_nodes
    assert all(p < i for i, p in enumerate(tree.parents))                 # parents still come first


def test_room_for_the_branch_is_made_from_the_least_confident_nodes():
    tree = DraftTree()
    a = tree.add(ROOT, 10, 0.6, 0)                     # confidence 0.6
    tree.add(ROOT, 20, 0.3, 1)                         # 0.3
    tree.add(a, 11, 0.5, 0)                            # 0.3, later
    tree.add(a, 12, 0.1, 1)                            # 0.06
    assert tree.make_room_for([10, 11], max_nodes=4) is tree          # shared all the way: nothing to add
    cut = tree.make_room_for([10, 13, 14], max_nodes=4)               # 2 new nodes: keep "10" and the best other
    assert cut.tokens == [10, 20] and cut.parents == [ROOT, ROOT]
    cut.merge_branch([10, 13, 14], "pld", max_nodes=4)
    assert cut.tokens == [10, 20, 13, 14] and cut.parents == [ROOT, ROOT, 0, 2]
    cut = tree.make_room_for([12, 13, 14, 15, 16], max_nodes=3)       # a branch longer than the budget
    assert cut.tokens == [] and cut.merge_branch([12, 13, 14, 15, 16], "pld", max_nodes=3) == [0, 1, 2]
    cut = tree.make_room_for([10, 12, 9], max_nodes=3)                # keeps the shared "10 12" though 0.06
    assert cut.tokens == [10, 12] and cut.parents == [ROOT, 0]


@pytest.mark.parametrize("cfg", [
    dict(method="dynamic", depth=3, top_k=4, total_tokens=12, lookup=3),
    dict(method="dynamic", depth=1, top_k=1, total_tokens=1, lookup=6),
    dict(method="static", lookup=2),
    dict(method="threshold", depth=3, lookup=4),
])
def test_greedy_output_with_a_lookup_branch_is_plain_greedy(tiny, cfg):
    target, head = tiny
    engine = Engine(target, head)
    tree = TreeConfig(**cfg)
    copied = 0
    for prompt in PROMPTS:
        *steps, summary = engine.generate(prompt_ids=prompt, tree=tree, max_new_tokens=40)
        assert summary.token_ids == hf_greedy(target, prompt, 40)
        for s in steps[1:]:
            assert s.tree_config["lookup"] == tree.lookup
            assert len(s.tree) <= tree.max_nodes and max(s.tree.depths) <= tree.max_path
            if s.tree.source is not None:
                assert set(s.tree.source) <= {None, "pld"}
                copied += sum(src == "pld" and st == "accepted" for src, st in zip(s.tree.source, s.tree.status))
    assert copied > 0      # the branch's own nodes were accepted, or this proves little


def test_the_branch_fills_the_free_rows_then_takes_the_heads_places(tiny):
    """Where the verify forward's rows cost alike up to a register block (``free_rows``), the
    branch adds nodes up to the block and beyond it replaces the head's least confident ones;
    where rows are not counted it adds up to ``lookup`` nodes. Output is plain greedy either way."""
    target, head = tiny
    engine = Engine(target, head)
    tree = TreeConfig(depth=2, top_k=2, total_tokens=3, lookup=3)
    sizes = {}
    for free_rows in (None, 5, 4):
        engine.free_rows = free_rows
        *steps, summary = engine.generate(prompt_ids=PROMPTS[0], tree=tree, max_new_tokens=30)
        assert summary.token_ids == hf_greedy(target, PROMPTS[0], 30)
        branched = [s for s in steps[1:] if s.tree.source is not None]
        assert branched
        sizes[free_rows] = max(len(s.tree) for s in branched)
    assert sizes == {None: 6, 5: 4, 4: 3}     # total + lookup; the block's 4 rows past the root; total


def test_the_branch_is_only_verified_where_it_is_asked_for(tiny):
    target, head = tiny
    engine = Engine(target, head)
    *steps, _ = engine.generate(prompt_ids=PROMPTS[0], tree=TreeConfig(depth=2, top_k=2, total_tokens=4),
                                max_new_tokens=20)
    assert all(s.tree.source is None and "lookup" not in s.tree_config for s in steps[1:])
    # a sampled chain's rule needs every node drawn from q: no branch there (the prompt ends in
    # the target's greedy loop, where the same tree under greedy decoding gets one)
    prompt = PROMPTS[1] + hf_greedy(target, PROMPTS[1], 24)
    chain3 = TreeConfig(method="chain", depth=3, lookup=3)
    *steps, _ = engine.generate(prompt_ids=prompt, tree=chain3, max_new_tokens=20)
    assert any(s.tree.source for s in steps[1:])
    for seed in range(5):
        *steps, _ = engine.generate(prompt_ids=prompt, tree=chain3, max_new_tokens=20,
                                    sampling=SamplingConfig(temperature=0.2, seed=seed))
        assert all(s.rule == "sampled_chain" and s.tree.source is None for s in steps[1:])


def test_sampled_output_with_a_lookup_branch_is_the_targets(tiny):
    """The first two sampled tokens against the target's exact joint p(a) p(b | a), by the
    chi-square test of test_sampling.py: the branch's tokens are fixed candidates, which
    sequential_verify accepts exactly. The prompt ends in the target's own greedy loop, so a
    branch exists wherever the first sampled token keeps to it."""
    target, _ = tiny
    engine = Engine(target, random_head(target))     # an untrained head: the branch's nodes carry the run
    prompt = PROMPTS[1] + hf_greedy(target, PROMPTS[1], 24)
    sampling = dict(temperature=0.2)
    n = 1200
    counts: dict[tuple, int] = {}
    copied = 0
    tree = TreeConfig(method="dynamic", depth=1, top_k=2, total_tokens=1, lookup=3)   # not a chain: q's top-1
    for seed in range(n):
        *steps, summary = engine.generate(prompt_ids=prompt, tree=tree, max_new_tokens=2,
                                          sampling=SamplingConfig(**sampling, seed=seed))
        key = tuple(summary.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        s = steps[1]
        assert s.rule == "sampled_tree"
        copied += any(src == "pld" and st == "accepted" for src, st in zip(s.tree.source or [], s.tree.status))
    stat, threshold = chi_square(counts, exact_joint(target, prompt, engine.eos_ids, **sampling), n)
    assert stat < threshold, (stat, threshold)
    assert copied > 30, copied     # the branch's own tokens were accepted in many runs


def test_records_with_a_branch_load_as_a_trace_and_the_page_tells_it_apart(tiny):
    target, head = tiny
    engine = Engine(target, head)
    *steps, summary = engine.generate(prompt_ids=PROMPTS[0], tree=TreeConfig(depth=2, top_k=2, total_tokens=3, lookup=4),
                                      max_new_tokens=24)
    with_branch = [s for s in steps[1:] if s.tree.source is not None]
    assert with_branch
    trace = parse_trace(dumps(trace_dict({"method": "dynamic"}, {"name": "tiny"}, steps, summary)))
    assert [s.tree.source for s in trace.steps[1:]] == [s.tree.source for s in steps[1:]]
    bad = trace_dict({"method": "dynamic"}, {"name": "tiny"}, steps, summary)
    step = next(r for r in bad["records"] if r.get("tree") and r["tree"].get("source"))
    step["tree"]["source"] = step["tree"]["source"][:-1]
    with pytest.raises(TraceError, match="source"):
        parse_trace(dumps(bad))

    s = with_branch[0]
    fig = tree_figure(s)
    own = next(t for t in fig.data if t.name == "nodes")
    copied = next(t for t in fig.data if t.name == "copied nodes")
    assert sorted(own.customdata) == [i for i, src in enumerate(s.tree.source) if src is None]
    assert sorted(copied.customdata) == [i for i, src in enumerate(s.tree.source) if src == "pld"]
    assert all("prompt lookup" in h for h in copied.hovertext) and list(copied.marker.color) == [LOOKUP_FILL] * len(copied.x)
    assert not any("prompt lookup" in h for h in own.hovertext)


def test_the_adapter_learns_from_a_copied_path_for_every_shorter_chain():
    adapter = TreeAdapter([chain(1), chain(2), chain(4)], prior_tau={"1/1/1": 1.0, "2/2/1": 1.0, "4/4/1": 1.0})
    adapter.start(chain(4))
    for arm in adapter.arms:
        arm.ms = 10.0
    tree = DraftTreeRecord(root_token=1, tokens=[5, 6, 7, 8, 9], texts=[""] * 5, parents=[ROOT, 0, 1, 2, 0],
                           depths=[1, 2, 3, 4, 2], q=[0.5] * 4 + [1.0], confidence=[0.5] * 5, p=None,
                           status=["accepted", "rejected", "unreached", "unreached", "accepted"],
                           source=[None] * 4 + ["pld"])
    event = StepEvent(step=1, method="dynamic", tree=tree, accepted=[5, 9], bonus=3, new_tokens=[5, 9, 3], text="",
                      tree_config=chain(4).shape(), step_ms=10.0)
    adapter.observe(event)
    # the branch hangs from every chain alike: 3 tokens for each, moving its prior (1.0) by the decay
    assert [a.tau for a in adapter.arms] == [1.5, 1.5, 1.5]


def test_the_auto_tree_verifies_a_branch_unless_told_not_to(tiny):
    target, head = tiny
    engine = Engine(target, head)
    start, adapter, _ = adapter_for(engine, TreeConfig(), measure=False)
    n = auto_lookup(engine)
    assert start.lookup == n and all(t.lookup == n for t in adapter.candidates if t.uses_draft)
    assert adapter.largest(start).lookup == n
    # the branch may copy more where the verify forward takes 8 rows or more for about the
    # price of one (AVX-512's register block), most with 16 (AMX tiles); not with AVX2's 4 nor
    # a GPU's eager forward
    assert AUTO_LOOKUP < WIDE_LOOKUP < WIDEST_LOOKUP
    for free, expected in ((None, AUTO_LOOKUP), (4, AUTO_LOOKUP), (7, AUTO_LOOKUP), (8, WIDE_LOOKUP),
                           (15, WIDE_LOOKUP), (16, WIDEST_LOOKUP)):
        engine.free_rows = free
        assert auto_lookup(engine) == expected
        assert adapter_for(engine, TreeConfig(), measure=False)[0].lookup == expected
    start, adapter, _ = adapter_for(engine, TreeConfig(), measure=False, lookup=0)
    assert all(t.lookup == 0 for t in adapter.candidates)
    specs = parse_methods("dynamic:4/2/2+lookup3,dynamic:adaptive+lookup0,dynamic", TreeConfig())
    assert [s.tree.lookup for s in specs] == [3, 0, 0] and [s.lookup for s in specs] == [3, 0, None]
    for bad in ("pld+lookup3", "dynamic+lookupx"):
        with pytest.raises(ValueError, match="lookup"):
            parse_methods(bad, TreeConfig())
    with pytest.raises(ValueError, match="lookup"):
        TreeConfig(lookup=-1)

