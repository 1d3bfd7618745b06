"""Thread count chosen by timing (app/engine/threads.py), and the CLI that never sizes its tree
in the foreground."""
from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine import threads


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
        time.sleep(0.002 if n == 1 else 0.03)

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
