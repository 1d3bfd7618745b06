"""The default draft head is the shipped head this machine's kept profile predicts faster
(app/engine/head_choice.py): measured, never assumed, and never measured in the foreground."""
from __future__ import annotations

import pytest

from app.engine import autotune, loading
from app.engine.engine import Engine
from app.engine.head_choice import choose_head, shipped_engines

SMALL = {"prompts": ("w5 w6 w7", "w9 w3 w4"), "depth": 3, "top_k": 3, "total_tokens": 8, "max_new_tokens": 16,
         "vanilla_tokens": 3}


@pytest.fixture(scope="module")
def heads(tiny):
    """A target, an untrained head in the default's place and a trained one in the other's."""
    from tests.tiny import random_head

    target, trained = tiny
    return target, random_head(target), trained


def test_a_head_is_predicted_only_once_calibrated_here(heads, tmp_path, monkeypatch):
    """No kept profile, no prediction (nothing measured in the foreground); after
    `python -m app tune` for one head, that head alone has one."""
    from app.engine.head_choice import predicted_tokens_per_s

    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "CALIBRATION_SETTINGS", {**autotune.CALIBRATION_SETTINGS, **SMALL})
    target, eagle2, eagle3 = heads
    engines = {"eagle2": Engine(target, eagle2), "eagle3": Engine(target, eagle3)}
    first = choose_head(engines)
    assert first.name == "eagle2" and first.predicted == {"eagle2": None, "eagle3": None}
    assert "eagle3 not calibrated here" in first.text()
    _, choice = autotune.choose_tree(engines["eagle3"])              # measures once, keeps it
    assert predicted_tokens_per_s(engines["eagle3"]) == pytest.approx(choice.predicted_tokens_per_s)
    only3 = choose_head(engines)
    assert only3.name == "eagle2" and only3.predicted["eagle2"] is None   # the default is never un-chosen unmeasured


def test_the_head_predicted_faster_here_drafts_by_default(heads, monkeypatch):
    """Both calibrated: the higher prediction wins, and the page's start swaps that head's
    engine in and keeps the other for the comparison. (The predictions are set here: on the
    tiny models a tree barely pays, so measured ones differ by noise.)"""
    from app.engine import head_choice
    from app.ui.settings import _faster_head

    target, eagle2, eagle3 = heads
    engines = {"eagle2": Engine(target, eagle2), "eagle3": Engine(target, eagle3)}
    rates = {id(engines["eagle2"]): 40.0, id(engines["eagle3"]): 55.0}
    monkeypatch.setattr(head_choice, "predicted_tokens_per_s", lambda engine, probe_ms=None: rates[id(engine)])
    assert choose_head(engines).name == "eagle3"
    said = []
    engine, others = _faster_head(engines["eagle2"], {"eagle3": engines["eagle3"]}, said.append)
    assert engine is engines["eagle3"] and others == {"eagle2": engines["eagle2"]}
    assert "draft head eagle3" in said[0] and "eagle2 40.0, eagle3 55.0" in said[0]
    rates[id(engines["eagle3"])] = 30.0
    assert choose_head(engines).name == "eagle2"
    assert _faster_head(engines["eagle2"], {"eagle3": engines["eagle3"]}, said.append)[0] is engines["eagle2"]


def test_a_tie_keeps_the_default_and_only_the_embedded_target_gets_the_shipped_heads(heads, tmp_path, monkeypatch):
    from app.engine import head_choice

    target, eagle2, eagle3 = heads
    engines = {"eagle2": Engine(target, eagle2), "eagle3": Engine(target, eagle3)}
    monkeypatch.setattr(head_choice, "predicted_tokens_per_s", lambda engine, probe_ms=None: 50.0)
    assert choose_head(engines).name == "eagle2"

    eagle2.save(tmp_path / "eagle2")
    eagle3.save(tmp_path / "eagle3")
    monkeypatch.setattr(loading, "SHIPPED_HEADS", {"eagle2": tmp_path / "eagle2", "eagle3": tmp_path / "eagle3"})
    mine = Engine(target, loading.load_draft_head(str(tmp_path / "eagle2"), target))
    built = shipped_engines(mine, None, lambda folder: folder.name)
    assert built == {"eagle3": "eagle3"}                          # every shipped head but the engine's own
    assert shipped_engines(mine, str(tmp_path), lambda folder: folder.name) == {}   # another target
