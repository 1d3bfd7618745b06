"""The kept profile of the auto tree (app/engine/autotune.py, "a kept profile"): one kept for
any thread count serves a start at another, so a start beside a busy neighbour, which picks
fewer threads, measures nothing; and a profile measured beside other work is marked so and
replaced by a quieter measurement, never by a busier one. The load is injected
(``autotune._load_average``), so none of this depends on how busy the test machine is."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from app.engine import autotune

SMALL = {"prompts": ("w5 w6 w7",), "depth": 3, "top_k": 3, "total_tokens": 8, "max_new_tokens": 12,
         "vanilla_tokens": 3}


@pytest.fixture
def small_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "CALIBRATION_SETTINGS", {**autotune.CALIBRATION_SETTINGS, **SMALL})
    return tmp_path


def _at_threads(n, fn, *a, **kw):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn(*a, **kw)
    finally:
        torch.set_num_threads(before)


def _count_measuring(monkeypatch) -> list:
    """From now on a measurement fails the test, and is counted (in case it is caught)."""
    counted = []

    def measured(what):
        def stand_in(*a, **k):
            counted.append(what)
            raise AssertionError(f"measured {what} in the foreground")
        return stand_in

    monkeypatch.setattr(autotune, "measure_forward_costs", measured("T(n)"))
    monkeypatch.setattr(autotune, "calibrate", measured("calibrate"))
    return counted


def test_a_profile_kept_at_2_threads_serves_a_1_thread_start_without_measuring(tiny, small_profile, monkeypatch,
                                                                                 capsys):
    """The measured start: `generate` beside a busy process picks 1 thread; the only kept
    profile is the 2-thread one (`python -m app tune` on a quiet moment). It must be read,
    scaled by the thread probe, and nothing measured: by the CLI, by the page's run
    (``tree_plan``'s ``adapter_for``) and by the page's start (``auto_tree_defaults``)."""
    from app import cli
    from app.engine.adapt import adapter_for
    from app.engine.engine import Engine
    from app.ui.settings import auto_tree_defaults

    target, head = tiny
    engine = Engine(target, head)                 # the fast forward, where a first start measures
    monkeypatch.setattr(autotune, "_load_average", lambda: 0.2)
    tree2, kept = _at_threads(2, autotune.choose_tree, engine, probe_ms={1: 40.0, 2: 25.0})
    assert kept.cost_curve.key["threads"] == 2 and kept.cost_curve.key["probe_ms"] == {"1": 40.0, "2": 25.0}
    assert torch.get_num_threads() == 1
    counted = _count_measuring(monkeypatch)

    # the CLI's start (threads fixed to 1, as the governor picks beside a busy neighbour)
    monkeypatch.setattr("app.engine.factory.load_engine", lambda *a, **k: (engine, ""))
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    assert cli.main(p.parse_args(["--prompt", "w5 w6 w7", "--max-new-tokens", "8", "--raw", "--threads", "1"])) == 0
    err = capsys.readouterr().err
    assert counted == [], err
    assert "measuring it once" not in err and "no kept profile" not in err and "starting at the tuned" in err
    assert "kept profile: measured at 2 thread(s)" in err

    # scaled by the probe: a probe forward (over 1 and 4 tokens) costs 120 ms now at 1 thread,
    # T(1) + T(4) on the 2-thread curve
    derived = autotune.kept_cost_curve(target, probe_ms={1: 120.0, 2: 400.0})
    scale = 120.0 / (kept.cost_curve(1) + kept.cost_curve(4))
    assert derived.key["threads"] == 1 and derived.key["derived_from"] == {"threads": 2, "scale": scale}
    assert derived.ms == pytest.approx([m * scale for m in kept.cost_curve.ms])
    assert derived(1) + derived(4) == pytest.approx(120.0)      # the curve prices the probe as measured now
    # ... which changes the reported ms, not the pick
    tree1, choice = autotune.choose_tree(engine, measure=False, probe_ms={1: 120.0, 2: 400.0})
    assert tree1 == tree2 and choice.predicted_speedup == pytest.approx(kept.predicted_speedup)

    # the page: a run's adaptive tree and the start-up's default tree
    start, adapter, choice = adapter_for(engine, measure=False, probe_ms={1: 30.0})
    shape = (tree2.depth, tree2.top_k, tree2.total_tokens)
    assert choice is not None and (choice.tree.depth, choice.tree.top_k, choice.tree.total_tokens) == shape
    tree_page, note, _ = auto_tree_defaults(engine, log=lambda m: None)
    assert (tree_page.depth, tree_page.top_k, tree_page.total_tokens) == shape and counted == []


def test_without_any_profile_a_start_still_measures_once(tiny, small_profile, monkeypatch, capsys):
    """The other side of the rule: no thread count has a profile, so the fast forward's first
    start measures one, and says so in one line."""
    from app import cli
    from app.engine.engine import Engine

    target, head = tiny
    engine = Engine(target, head)
    monkeypatch.setattr("app.engine.factory.load_engine", lambda *a, **k: (engine, ""))
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    assert cli.main(p.parse_args(["--prompt", "w5 w6 w7", "--max-new-tokens", "6", "--raw", "--threads", "1"])) == 0
    err = capsys.readouterr().err
    assert sum("measuring it once" in line for line in err.splitlines()) == 1
    assert len(list((small_profile / "autotune").glob("*.json"))) == 2


def test_a_busy_profile_is_replaced_by_a_quieter_one_never_by_a_busier_one(tiny, small_profile, monkeypatch):
    """Cost curve and calibration alike: kept at load 1.8 (marked busy), a re-measurement at
    2.5 leaves it, one at 0.3 replaces it; the quiet one is then not replaced at 1.5."""
    from app.engine.engine import Engine

    target, head = tiny
    engine = Engine(target, head)
    load = {"now": 1.8}
    monkeypatch.setattr(autotune, "_load_average", lambda: load["now"])
    sizes, fast = (1, 2, 4), {"prefix_len": 16, "repeats": 1, "warmup": 0}
    small = {k: v for k, v in SMALL.items() if k != "prompts"}
    path = autotune.cost_cache_path(autotune.cost_cache_key(target))

    def kept_loads():
        cal = autotune.kept_calibration(engine, derive=False, **small)
        return json.loads(path.read_text())["key"]["load"], cal.load

    autotune.forward_cost_curve(target, sizes=sizes, **fast)
    autotune.cached_calibration(engine, **small)
    assert kept_loads() == (1.8, 1.8) and autotune.under_load(1.8)
    notes = []
    for now, kept in ((2.5, 1.8), (0.3, 0.3), (1.5, 0.3), (0.6, 0.6)):
        load["now"] = now
        curve = autotune.forward_cost_curve(target, sizes=sizes, refresh=True, progress=notes.append, **fast)
        cal = autotune.cached_calibration(engine, refresh=True, progress=notes.append, **small)
        assert kept_loads() == (kept, kept), now
        assert curve.key["load"] == cal.load == kept          # what is returned is what is kept
    assert sum("kept the cost curve measured at load average 1.80" in n for n in notes) == 1
    assert sum("kept the calibration measured at load average 0.30" in n for n in notes) == 1
    # the rule itself, readings missing included
    assert autotune.replaces(0.9, 0.2) and not autotune.replaces(1.2, 0.2) and autotune.replaces(1.2, 1.3)
    assert autotune.replaces(None, None) and autotune.replaces(3.0, None) and not autotune.replaces(None, 0.2)
    # a note for a profile in use that was measured beside other work
    busy = autotune.CostCurve(sizes=[1, 2], ms=[1.0, 1.5], key={"load": 1.8, "threads": 1})
    assert "tune --retune" in autotune.profile_note(busy) and autotune.profile_note(curve) == ""
