"""The hardware-aware tree size: the cost model's argmax, the tau estimate from a large tree,
the on-disk caches, and one end-to-end choice on a tiny model."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine import autotune
from app.engine.autotune import Calibration, CostCurve, choose_from, predict, rank_candidates

# A CPU-like curve (grows with the tree) and a GPU-like one (flat): ms per forward over n tokens.
CPU = CostCurve(sizes=[1, 8, 16, 24, 32, 48, 64], ms=[60, 83, 99, 110, 124, 160, 195])
GPU = CostCurve(sizes=[1, 8, 16, 24, 32, 48, 64], ms=[20, 20, 20.5, 21, 21, 22, 23])


def test_cost_curve_interpolates_and_extrapolates():
    assert CPU(1) == 60 and CPU(64) == 195
    assert CPU(12) == pytest.approx(91)            # halfway between 8 and 16
    assert CPU(0) == 60                             # clamped below
    assert CPU(80) == pytest.approx(195 + 16 * (195 - 160) / 16)


def synthetic_tau(depth, total):
    """A head whose accepted length saturates in both depth and tree size."""
    per_level = [0.8, 0.6, 0.45, 0.3, 0.2, 0.1, 0.05]
    gain, p = 0.0, 1.0
    for d in range(depth):
        p *= per_level[d]
        gain += p
    return 1.0 + gain * min(1.0, total / (4.0 * depth)), 0.0


@pytest.mark.parametrize("cost", [CPU, GPU], ids=["cpu", "gpu"])
def test_choice_is_the_argmax_of_its_own_model(cost):
    ranked = rank_candidates(cost, synthetic_tau, draft_ms_per_level=8.0, other_ms=5.0)
    brute = max(((d, t) for d in autotune.DEFAULT_DEPTHS for t in autotune.DEFAULT_TOTALS if t >= d),
                key=lambda dt: predict(cost, synthetic_tau(*dt)[0], dt[0], dt[1], 8.0, 5.0)[2])
    assert (ranked[0].depth, ranked[0].total_tokens) == brute
    assert all(a.tokens_per_s >= b.tokens_per_s for a, b in zip(ranked, ranked[1:]))


def test_flat_cost_picks_a_bigger_tree_than_steep_cost():
    cpu = rank_candidates(CPU, synthetic_tau, 8.0, 5.0)[0]
    gpu = rank_candidates(GPU, synthetic_tau, 0.5, 1.0)[0]
    assert gpu.total_tokens > cpu.total_tokens


def big_tree_calibration() -> Calibration:
    # two steps of a depth-3 tree; node = [depth, confidence, accepted]
    step1 = [[1, 0.9, 1], [1, 0.05, 0], [2, 0.6, 1], [2, 0.2, 0], [3, 0.3, 0], [3, 0.25, 1]]
    step2 = [[1, 0.5, 0], [1, 0.4, 1], [2, 0.3, 0], [2, 0.35, 1], [3, 0.1, 0]]
    return Calibration(steps=[step1, step2], draft_ms=[30.0, 30.0], verify_ms=[100.0, 100.0],
                       step_ms=[140.0, 140.0], vanilla_step_ms=[62.0, 58.0], depth=3, top_k=2, total_tokens=6)


def test_tau_counts_accepted_nodes_of_the_smaller_tree():
    cal = big_tree_calibration()
    # depth 1, 1 node: step1 keeps node 0 (accepted), step2 keeps node 0 (rejected)
    assert cal.tau(1, 1)[0] == pytest.approx(1 + (1 + 0) / 2)
    # depth 3, 3 nodes: step1 keeps 0.9, 0.6, 0.3 -> 2 accepted; step2 0.5, 0.4, 0.35 -> 2
    assert cal.tau(3, 3)[0] == pytest.approx(1 + 2)
    # the whole tree: every accepted node counts
    assert cal.tau(3, 6)[0] == pytest.approx(1 + (3 + 2) / 2)
    # EAGLE-2's estimate: sum of kept confidences
    assert cal.tau(1, 1)[1] == pytest.approx(1 + (0.9 + 0.5) / 2)


def test_top1_chain_follows_the_most_confident_child_from_the_root():
    # root -> 0 (0.6) / 1 (0.3); 0 -> 2 (0.4) / 3 (0.1); 2 -> 4 (0.2); 3 -> 5 (0.05); 1 -> 6 (0.25)
    parents = [-1, -1, 0, 0, 2, 3, 1]
    confidence = [0.6, 0.3, 0.4, 0.1, 0.2, 0.05, 0.25]
    assert autotune.top1_chain(parents, confidence) == [1, 0, 1, 0, 1, 0, 0]
    assert autotune.top1_chain([], []) == []


def chain_calibration() -> Calibration:
    """Two steps where the top-1 chain is accepted two levels deep, while the second-best
    depth-1 sibling is more confident than the chain's depth-2 node and never accepted:
    node = [depth, confidence, accepted, on the top-1 chain]."""
    step = [[1, 0.7, 1, 1], [1, 0.55, 0, 0], [2, 0.5, 1, 1], [2, 0.1, 0, 0], [3, 0.2, 0, 1], [3, 0.05, 0, 0]]
    return Calibration(steps=[step, step], draft_ms=[6.0, 6.0], verify_ms=[70.0, 70.0], step_ms=[78.0, 78.0],
                       vanilla_step_ms=[46.0], depth=3, top_k=4, total_tokens=6)


def test_a_top1_chain_competes_and_wins_where_siblings_are_never_accepted():
    cal = chain_calibration()
    assert cal.tau_chain(1) == (pytest.approx(2.0), pytest.approx(1.7))
    assert cal.tau_chain(2)[0] == pytest.approx(3.0) and cal.tau_chain(3)[0] == pytest.approx(3.0)
    # EAGLE-2's 2-node tree keeps the two most confident nodes, both at depth 1: tau 2 only
    assert cal.tau(2, 2)[0] == pytest.approx(2.0)
    # steep CPU-like costs (T(3) = 53 ms, T(4) = 70 ms): the 2-node chain is the argmax
    steep = CostCurve(sizes=[1, 2, 3, 4, 6, 8], ms=[46, 50, 53, 70, 77, 89])
    choice = choose_from(steep, cal)
    ranked = choice.candidates
    chains = [c for c in ranked if c.top_k == 1]
    assert sorted(c.depth for c in chains) == [1, 2, 3] and all(c.total_tokens == c.depth for c in chains)
    best = ranked[0]
    assert (best.depth, best.total_tokens, best.top_k) == (2, 2, 1) and best.tau == pytest.approx(3.0)
    assert best.tokens_per_s > ranked[1].tokens_per_s
    assert (choice.tree.depth, choice.tree.total_tokens, choice.tree.top_k) == (2, 2, 1)
    assert choice.to_dict()["candidates"][0]["top_k"] == 1
    # records without chain flags (an older cache) give the chains no accepted tokens
    assert big_tree_calibration().tau_chain(3) == (1.0, 1.0)


def test_choose_from_uses_measured_parts():
    cal = big_tree_calibration()
    choice = choose_from(CPU, cal)
    best = autotune.pick_robust(choice.candidates)
    assert (choice.tree.depth, choice.tree.total_tokens) == (best.depth, best.total_tokens) == \
        (choice.chosen.depth, choice.chosen.total_tokens)
    assert choice.tree.method == "dynamic" and choice.tree.top_k == 2
    assert choice.draft_ms_per_level == pytest.approx(10.0)                 # 30 ms over 3 levels
    assert choice.verify_ms_per_row == pytest.approx((100 - CPU(7)) / 7)
    assert choice.other_ms == pytest.approx(140 - 30 - 100)
    assert choice.predicted_vanilla_tokens_per_s == pytest.approx(1000 / 60)
    assert best.total_tokens <= 6 and best.depth <= 3                       # never beyond what was measured
    # the calibration's times are put on the curve's scale through its vanilla step: the
    # same calibration timed at twice the load predicts the same ratios to vanilla
    slow = Calibration(**{**cal.__dict__, "draft_ms": [60.0, 60.0], "verify_ms": [200.0, 200.0],
                          "step_ms": [280.0, 280.0], "vanilla_step_ms": [124.0, 116.0]})
    again = choose_from(CPU, slow)
    assert again.tree == choice.tree and again.predicted_speedup == pytest.approx(choice.predicted_speedup)
    d = choice.to_dict()
    json.dumps(d)                                                           # the app can ship it as is
    assert d["cost_curve"]["sizes"] == CPU.sizes and "auto tree" in choice.summary()


def test_cost_cache_round_trip(tmp_path, monkeypatch):
    from tests.tiny import tiny_target

    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))
    target = tiny_target()
    calls = []
    real = autotune.measure_forward_costs

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(autotune, "measure_forward_costs", counting)
    sizes = (1, 4, 8)
    first = autotune.forward_cost_curve(target, sizes=sizes, prefix_len=16, repeats=1, warmup=0)
    second = autotune.forward_cost_curve(target, sizes=sizes, prefix_len=16, repeats=1, warmup=0)
    assert len(calls) == 1
    assert first.ms == sorted(first.ms) and len(first.key["raw_ms"]) == len(sizes)   # non-decreasing in n
    assert len(first.noise) == len(sizes) and first.noise[0] == 0.0
    assert second.sizes == first.sizes == list(sizes) and second.ms == first.ms
    path = autotune.cost_cache_path(autotune.cost_cache_key(target))
    assert path.is_file() and str(path).startswith(str(tmp_path))
    assert autotune.load_cost_curve(path).key["model"] == target.name
    cached = json.loads(path.read_text())
    cached["key"]["load"] = 7.5                          # measured on a busy machine: kept all the same
    path.write_text(json.dumps(cached))                  # (its ratios cancel the load), never re-measured
    autotune.forward_cost_curve(target, sizes=sizes, prefix_len=16, repeats=1, warmup=0)
    assert len(calls) == 1
    autotune.forward_cost_curve(target, sizes=sizes, refresh=True, prefix_len=16, repeats=1, warmup=0)
    assert len(calls) == 2                               # ... unless asked to (python -m app tune --retune)
    path.write_text("{not json")                     # a corrupt cache is measured again, not trusted
    autotune.forward_cost_curve(target, sizes=sizes, prefix_len=16, repeats=1, warmup=0)
    assert len(calls) == 3


def test_choose_tree_end_to_end_on_a_tiny_model(tmp_path, monkeypatch):
    from app.engine.engine import Engine
    from tests.tiny import tiny_target, trained_head

    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))
    target = tiny_target()
    engine = Engine(target, trained_head(target, steps=60))
    settings = {"prompts": ("w5 w6 w7", "w9 w10"), "depth": 4, "top_k": 4, "total_tokens": 24,
                "max_new_tokens": 24, "vanilla_tokens": 6}
    assert autotune.choose_tree(engine, calibration=settings, measure=False) == (None, None)   # nothing kept yet
    assert not (tmp_path / "autotune").exists()                                             # and nothing measured
    tree, choice = autotune.choose_tree(engine, calibration=settings)
    assert tree.method == "dynamic" and 1 <= tree.depth <= 4 and tree.depth <= tree.total_tokens <= 24
    assert choice.calibration_steps > 0 and choice.predicted_tokens_per_s > 0
    assert len(list((tmp_path / "autotune").glob("*.json"))) == 2   # cost curve + calibration cached
    again, _ = autotune.choose_tree(engine, calibration=settings)
    assert again == tree
    assert autotune.choose_tree(engine, calibration=settings, measure=False)[0] == tree   # the kept profile
    # A calibration timed on a busy machine is kept: its tau table does not depend on load, and
    # its timings are used relative to its own interleaved vanilla steps.
    calls = []
    real = autotune.calibrate
    monkeypatch.setattr(autotune, "calibrate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    path = next((tmp_path / "autotune").glob("calib-*.json"))
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "load": 6.5}))
    autotune.choose_tree(engine, calibration=settings)
    assert calls == []
    autotune.choose_tree(engine, calibration=settings, refresh=True)
    assert calls == [1]
    with pytest.raises(ValueError, match="dynamic"):
        autotune.choose_tree(engine, method="chain")
    with pytest.raises(ValueError, match="head"):
        autotune.choose_tree(Engine(target, None))


def test_calibration_prompts_are_neither_eval_nor_training_prompts():
    """tau is measured on the built-in prompts, so they must not be questions the benchmark
    asks (the auto tree would be tuned on the test) nor prompts the head was trained on
    (acceptance there is optimistic): no exact match, no near-duplicate of either."""
    from app.train.eval_overlap import ngrams, normalise
    from app.train.prompts import Prompt, build_prompts
    from tests.test_train import _assert_disjoint_from_eval, _jaccard

    calib = [Prompt(id=str(i), category="calibration", text=t) for i, t in enumerate(autotune.CALIBRATION_PROMPTS)]
    assert len(calib) >= 8                     # several kinds of request, not one or two
    _assert_disjoint_from_eval(calib)
    training = build_prompts(12288, seed=0)    # the shipped head's prompt set
    texts = {normalise(p.text) for p in training}
    grams = [ngrams(p.text) for p in training]
    for c in calib:
        assert normalise(c.text) not in texts, c.text
        cg = ngrams(c.text)
        assert max(_jaccard(cg, g) for g in grams) < 0.5, c.text


def test_calibration_cache_key_holds_the_default_settings(tmp_path, monkeypatch):
    """A change of calibrate()'s defaults (prompts, lengths) must not reuse old records."""
    from app.engine.engine import Engine
    from tests.tiny import tiny_target, trained_head

    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))
    target = tiny_target()
    engine = Engine(target, trained_head(target, steps=10))
    small = {"depth": 2, "top_k": 2, "total_tokens": 4, "max_new_tokens": 6, "vanilla_tokens": 2}
    for prompts in (("w5 w6",), ("w7 w8",)):                  # the built-in prompts change
        monkeypatch.setitem(autotune.CALIBRATION_SETTINGS, "prompts", prompts)
        autotune.cached_calibration(engine, **small)
    keys = [json.loads(p.read_text())["key"] for p in (tmp_path / "autotune").glob("calib-*.json")]
    assert sorted(k["prompts"] for k in keys) == [["w5 w6"], ["w7 w8"]]   # recalibrated, not reused
    assert all(k["max_new_tokens"] == 6 and k["vanilla_tokens"] == 2 for k in keys)


def test_calibration_cache_key_names_what_the_head_drafts_with():
    """A calibration's step timings are its draft's: the same head drafting in its own forward
    and on the fast kernels' form of it must not share a record."""
    from app.engine import kernels
    from app.engine.engine import Engine
    from tests.tiny import eagle3_target, random_eagle3_head

    if kernels.load() is None:
        pytest.skip(f"fast kernels unavailable: {kernels.why_not()}")
    target = eagle3_target(0)
    head = random_eagle3_head(target)
    fast = Engine(target, head)
    eager = Engine(target, head)
    eager.draft_model.forward = head                 # as where the head has no fast form
    keys = [autotune._calibration_key(e, autotune.CALIBRATION_SETTINGS) for e in (fast, eager)]
    assert keys[0]["draft_forward"] == "RowwiseEagle3Head" and keys[1]["draft_forward"] == "head"
    assert autotune.calibration_cache_path(keys[0]) != autotune.calibration_cache_path(keys[1])


def test_measuring_and_calibrating_name_the_device_of_every_tensor(tiny):
    """GPU readiness without a GPU (see tests/test_sampling.py): with torch's default device
    set to "meta", a tensor made without naming its device breaks the first operation that
    mixes it with the model's CPU tensors. The cost curve and the calibration must still run."""
    from app.engine.engine import Engine

    target, head = tiny
    engine = Engine(target, head)
    torch.set_default_device("meta")
    try:
        curve = autotune.measure_forward_costs(target, sizes=(1, 2, 4), prefix_len=16)
        cal = autotune.calibrate(engine, prompts=("w5 w17 w33",), depth=2, top_k=2, total_tokens=4,
                                 max_new_tokens=8, vanilla_tokens=4)
    finally:
        torch.set_default_device(None)
    assert curve.sizes == [1, 2, 4] and all(ms > 0 for ms in curve.ms)
    assert cal.steps and len(cal.vanilla_step_ms) > 0


# --- robustness to a shared machine -----------------------------------------------------------

def test_ratios_cancel_a_load_that_hits_every_size_alike():
    """Round-robin repeats: repeat r of every size ran moments after repeat r of size 1, so a
    burst of load that slows one repeat slows it for every size and leaves the ratio alone."""
    quiet = {1: 20.0, 4: 24.0, 16: 40.0}
    load = [1.0, 3.0, 1.0, 2.5, 1.2]                        # how busy the machine was at each repeat
    times = {n: [t * f for f in load] for n, t in quiet.items()}
    ms, noise = autotune.curve_from_times([1, 4, 16], times)
    t1 = sorted(20.0 * f for f in load)[2]
    assert ms == pytest.approx([t1, t1 * 24 / 20, t1 * 40 / 20])
    assert noise == pytest.approx([0.0, 0.0, 0.0])          # the ratios never moved
    # bursts that hit one size only show up as that size's noise, not as its cost (the median)
    times[16][1] *= 3
    times[16][3] *= 3
    ms2, noise2 = autotune.curve_from_times([1, 4, 16], times)
    assert ms2 == pytest.approx(ms) and noise2[2] > 0 and noise2[1] == 0.0


def _cand(total, depth, tps, noise=0.0, top_k=None):
    return autotune.Candidate(depth=depth, total_tokens=total, tau=2.0, tau_confidence=2.0, verify_ms=10,
                              draft_ms=1, other_ms=1, tokens_per_s=tps, top_k=top_k, noise=noise)


cand_lists = st.lists(st.tuples(st.integers(1, 64), st.integers(1, 7), st.floats(1.0, 100.0),
                                st.floats(0.0, 0.5)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(cand_lists)
def test_pick_robust_is_the_argmax_without_noise_and_never_worse_than_the_noise(raw):
    ranked = sorted([_cand(t, d, r, n) for t, d, r, n in raw], key=lambda c: -c.tokens_per_s)
    best = ranked[0]
    pick = autotune.pick_robust(ranked)
    margin = best.tokens_per_s * (best.noise ** 2 + pick.noise ** 2) ** 0.5
    assert pick.tokens_per_s >= best.tokens_per_s - margin - 1e-9
    assert (pick.total_tokens, pick.depth) <= (best.total_tokens, best.depth)
    quiet = [_cand(c.total_tokens, c.depth, c.tokens_per_s) for c in ranked]
    q = autotune.pick_robust(quiet)
    assert q.tokens_per_s == quiet[0].tokens_per_s


@settings(max_examples=100, deadline=None)
@given(cand_lists, st.floats(0.1, 10.0))
def test_pick_robust_ignores_the_unit_of_time(raw, k):
    """Scaling every rate by the same factor (a uniformly slower machine) changes no choice."""
    ranked = sorted([_cand(t, d, r, n) for t, d, r, n in raw], key=lambda c: -c.tokens_per_s)
    scaled = [_cand(c.total_tokens, c.depth, c.tokens_per_s * k, c.noise) for c in ranked]
    a, b = autotune.pick_robust(ranked), autotune.pick_robust(scaled)
    assert (a.total_tokens, a.depth) == (b.total_tokens, b.depth)


def test_more_noise_never_picks_a_bigger_tree():
    ranked = [_cand(24, 5, 50.0), _cand(8, 3, 47.0), _cand(2, 2, 44.0, top_k=1)]
    picks = []
    for noise in (0.0, 0.05, 0.1, 0.2):
        picks.append(autotune.pick_robust([_cand(c.total_tokens, c.depth, c.tokens_per_s, noise) for c in ranked]))
    sizes = [p.total_tokens for p in picks]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 24 and sizes[-1] == 2
