"""Thread count chosen by timing (app/engine/threads.py), and the CLI that never sizes its tree
in the foreground."""
from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine import threads
from tests.tiny import Crowded


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([1, 2, 4, 8]), st.lists(st.floats(1.0, 1e4), min_size=1, max_size=5),
                       min_size=1))
def test_fastest_is_the_lowest_median_and_ties_go_to_fewer_threads(times):
    import statistics

    pick = threads.fastest(times)
    med = {n: statistics.median(t) for n, t in times.items()}
    assert pick in times
    assert med[pick] <= 1.05 * min(med.values()) + 1e-9          # never clearly slower than the best
    assert all(med[n] * 1.05 >= med[pick] for n in times if n < pick)   # fewer threads were not within 5%


def test_probe_times_every_option_and_drops_a_collapsed_one():
    """A fake forward whose cost depends on the thread count: 2 threads collapse (as with a
    busy neighbour), so the probe picks 1 and stops timing 2 after one round."""
    calls = {1: 0, 2: 0}

    def forward():
        n = torch.get_num_threads()
        calls[n] += 1
        time.sleep(0.002 if n == 1 else 0.25)   # apart by more than a busy machine delays a wake-up

    before = torch.get_num_threads()
    gov = threads.ThreadGovernor(options=[1, 2], rounds=3)
    assert gov.probe(forward) == 1
    assert calls[2] == 1 and calls[1] == 4          # 2 abandoned after the warm-up round
    assert torch.get_num_threads() == before        # a probe leaves the setting alone; apply sets it
    assert gov.apply(forward) == 1 and torch.get_num_threads() == 1
    torch.set_num_threads(before)
    assert threads.ThreadGovernor(fixed=3).apply(forward) == 3
    torch.set_num_threads(before)
    assert threads.thread_options(2) == [1, 2] and threads.thread_options(16) == [1, 8, 16]


def _two_threads_win(gov: threads.ThreadGovernor) -> None:
    """``gov.apply`` with a probe forward that 2 threads run faster: it chooses 2. The two
    sleeps are far apart: with two pytest workers beside it, a 2 ms sleep has woken 20 ms late."""
    assert gov.apply(lambda: time.sleep(0.002 if torch.get_num_threads() == 2 else 0.25)) == 2


def test_a_run_falls_back_to_one_thread_when_a_neighbour_arrives(tiny):
    """A run on 2 threads whose steps turn 40 -> 140 ms mid-run (a neighbour took a core)
    goes on one thread after SLOW_STEPS slow steps: the steps after are fast again, the
    output is the run's own, and the next run probes afresh."""
    from app.engine.config import TreeConfig
    from app.engine.engine import Engine

    target, head = tiny
    prompt, tree = [5, 17, 33, 90, 4], TreeConfig(method="vanilla")
    before = torch.get_num_threads()
    try:
        expected = [e for e in Engine(target, head).generate(prompt_ids=prompt, tree=tree, max_new_tokens=30)]
        engine = Engine(target, head)
        crowd = Crowded(engine)
        gov = threads.ThreadGovernor(options=[1, 2], rounds=1)
        _two_threads_win(gov)
        events = list(gov.guard(engine.generate(prompt_ids=prompt, tree=tree, max_new_tokens=30)))
        assert torch.get_num_threads() == 1 and gov.choice == 1
        assert "steps slowed" in gov.fell_back and "fell back" in gov.text()
        slow = [e.step for e in events if e.type == "step" and e.step_ms >= (crowd.pace_s + crowd.wait_s) * 1e3]
        assert slow == [crowd.after + 1, crowd.after + 2]          # exactly SLOW_STEPS slow steps, then one thread
        assert len(events) == len(expected) and events[-1].token_ids == expected[-1].token_ids
        probed = []
        gov.apply(lambda: probed.append(torch.get_num_threads()))
        assert probed and not gov.fell_back                          # the next run probes afresh
    finally:
        torch.set_num_threads(before)


def test_the_guard_keeps_the_threads_through_a_hiccup_and_a_fixed_count(tiny):
    """A real run's records replayed with chosen step times: one slow step alone, or steps
    less than SLOWDOWN times the usual, keep 2 threads; so does a fixed count, however slow.
    Closing the guard closes the run."""
    from dataclasses import replace

    from app.engine.config import TreeConfig
    from app.engine.engine import Engine

    target, head = tiny
    run = list(Engine(target, head).generate(prompt_ids=[3, 250], tree=TreeConfig(method="vanilla"), max_new_tokens=20))
    steps = [e for e in run if e.type == "step" and not e.prefill]
    assert len(steps) >= 12

    def replay(times):
        return [run[0]] + [replace(e, step_ms=t) for e, t in zip(steps, times)] + [run[-1]]

    usual = [10.0] * len(steps)
    hiccup = usual[:6] + [40.0] + usual[7:]                              # one slow step
    mild = usual[:6] + [2.4 * 10.0] * (len(steps) - 6)                   # slower, less than SLOWDOWN
    crowded = usual[:6] + [40.0] * (len(steps) - 6)
    before = torch.get_num_threads()
    try:
        for times, falls in ((usual, False), (hiccup, False), (mild, False), (crowded, True)):
            gov = threads.ThreadGovernor(options=[1, 2], rounds=1)
            _two_threads_win(gov)
            events = replay(times)
            assert list(gov.guard(iter(events))) == events                # passed through unchanged
            assert (torch.get_num_threads() == 1) == falls and bool(gov.fell_back) == falls, times
        torch.set_num_threads(2)
        fixed = threads.ThreadGovernor(fixed=2)
        list(fixed.guard(iter(replay(crowded))))
        assert torch.get_num_threads() == 2 and not fixed.fell_back
        inner = Engine(target, head).generate(prompt_ids=[3, 250], tree=TreeConfig(method="vanilla"), max_new_tokens=20)
        guarded = fixed.guard(inner)
        next(guarded)
        guarded.close()
        assert inner.gi_frame is None                                     # the run was closed too
    finally:
        torch.set_num_threads(before)


def test_a_multi_thread_cost_curve_is_kept_per_wait_policy(tiny, monkeypatch):
    """Sleeping and spinning threads give different curves on several threads: the policy is
    part of the key there, and not on one thread (where no thread waits)."""
    from app.engine import autotune

    target, _ = tiny
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
        monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
        passive = autotune.cost_cache_key(target)
        monkeypatch.delenv("OMP_WAIT_POLICY")
        assert passive["omp_wait"] == "passive" and autotune.cost_cache_key(target)["omp_wait"] == "default"
        monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
        assert autotune.cost_cache_key(target)["omp_wait"] == "spin 10000"
        torch.set_num_threads(1)
        assert "omp_wait" not in autotune.cost_cache_key(target)
    finally:
        torch.set_num_threads(before)


def test_engine_probe_runs_the_engines_forward(tiny):
    from app.engine.engine import Engine

    target, head = tiny
    forward = threads.engine_probe(Engine(target, head), prefix_len=8, tree_tokens=3)
    forward()
    forward()       # the cache is cropped back: the same work every time


def test_cli_generate_never_sizes_the_tree_in_the_foreground(monkeypatch, tmp_path, capsys, tiny):
    """`generate` with the default (auto) tree on the eager forward, counted not timed: no
    forward-cost measurement and no calibration run, with or without a kept profile; it adapts
    instead. (On the fast forward a first run measures the profile: tests/test_bench.py.)"""
    import argparse
    from dataclasses import replace

    from app import cli
    from app.engine import autotune
    from app.engine.engine import Engine

    target, head = tiny
    target = replace(target, forward="eager")
    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))
    monkeypatch.setattr("app.engine.factory.load_engine", lambda *a, **k: (Engine(target, head), ""))
    counted = []
    monkeypatch.setattr(autotune, "measure_forward_costs", lambda *a, **k: counted.append("T(n)"))
    monkeypatch.setattr(autotune, "calibrate", lambda *a, **k: counted.append("calibrate"))
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    args = p.parse_args(["--prompt", "w5 w6 w7", "--max-new-tokens", "24", "--raw", "--threads", "1"])
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert counted == [] and "adaptive tree" in err and "no kept profile" in err and "trees used" in err
    # with a kept profile: read, not measured, and the tuned tree joins the candidates
    settings_ = {"prompts": ("w5 w6 w7",), "depth": 3, "top_k": 3, "total_tokens": 8, "max_new_tokens": 12,
                 "vanilla_tokens": 3}
    monkeypatch.setattr(autotune, "CALIBRATION_SETTINGS", {**autotune.CALIBRATION_SETTINGS, **settings_})
    monkeypatch.undo()
    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "CALIBRATION_SETTINGS", {**autotune.CALIBRATION_SETTINGS, **settings_})
    engine = Engine(target, head)
    autotune.choose_tree(engine)                                    # `python -m app tune` did this once
    monkeypatch.setattr("app.engine.factory.load_engine", lambda *a, **k: (engine, ""))
    monkeypatch.setattr(autotune, "measure_forward_costs", lambda *a, **k: counted.append("T(n)"))
    monkeypatch.setattr(autotune, "calibrate", lambda *a, **k: counted.append("calibrate"))
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert counted == [] and "starting at the tuned" in err
    with pytest.raises(SystemExit):
        p.parse_args(["--threads"])
    assert cli.main(p.parse_args(["--prompt", "x", "--threads", "0"])) == 2
