"""Traces from strangers that passed the schema but broke a page: texts that are not Unicode,
runs that are not consistent, numbers too large for a float, and refusals as long as the file.
Each is refused while loading, in one short line (real tiny-model run, no server)."""
from __future__ import annotations

import copy
import json

import pytest

from app.engine.engine import Engine
from app.ui import traces
from app.ui.session import Session
from app.ui import handlers
from app.ui.settings import AppContext, ServerConfig


@pytest.fixture(scope="module")
def good(tiny):
    """A raced run's trace as a dict: EAGLE's records and vanilla's."""
    target, head = tiny
    ctx = AppContext(Engine(target, head), ServerConfig(update_interval_s=0.0), "tiny")
    session = Session()
    list(handlers.generate(ctx, session, prompt="w5 w17 w33 w90", method="dynamic", max_new_tokens=12,
                           temperature=0.0, depth=3, top_k=3, total_tokens=8))
    v = session.race_vanilla
    return json.loads(traces.dumps(traces.trace_dict(session.settings, session.model, session.steps,
                                                     session.summary, v.steps, v.summary)))


def _refused(trace, match: str):
    data = trace if isinstance(trace, str) else json.dumps(trace)
    with pytest.raises(traces.TraceError, match=match) as refused:
        traces.parse_trace(data, 10**8)
    assert len(str(refused.value)) <= 240, len(str(refused.value))


def test_the_good_trace_loads(good):
    trace = traces.parse_trace(json.dumps(good))
    assert trace.steps and trace.vanilla_steps and trace.summary.token_ids


def test_the_estimate_before_parsing_is_the_parsed_traces(good):
    """A load is refused for memory on ``estimate_bytes`` before the parse: for a valid trace
    it is exactly what the parsed records count (EAGLE's and vanilla's); JSON it cannot read
    gives None, and the parse then says why."""
    data = json.dumps(good)
    assert traces.estimate_bytes(data) == traces.trace_bytes(traces.parse_trace(data)) > 0
    no_race = {**good, "vanilla": None}
    assert traces.estimate_bytes(json.dumps(no_race)) == traces.trace_bytes(traces.parse_trace(json.dumps(no_race)))
    assert traces.estimate_bytes('{"records": [NaN]}') is None and traces.estimate_bytes("[1, 2") is None


@pytest.mark.parametrize("where", ["step text", "node text", "prompt", "model"])
def test_a_lone_surrogate_is_refused(good, where):
    t = copy.deepcopy(good)
    if where == "step text":
        t["records"][1]["text"] = "ok \ud800"
    elif where == "node text":
        t["records"][1]["tree"]["texts"][0] = "\udfff"
    elif where == "prompt":
        t["settings"]["prompt"] = "hello \ud83d"
    else:
        t["model"]["target"] = "x\ud800"
    _refused(json.dumps(t), "(?i)unicode")         # json.dumps writes the escape "\ud800"


def test_a_step_that_adds_no_token_is_refused(good):
    t = copy.deepcopy(good)
    vanilla_step = t["vanilla"][1]
    vanilla_step.update(accepted=[], new_tokens=[])
    _refused(t, r"vanilla\[1\]\.new_tokens")


def test_a_run_with_only_a_summary_is_refused(good):
    t = copy.deepcopy(good)
    t["records"] = t["records"][-1:]
    _refused(t, "records")
    t = copy.deepcopy(good)
    t["vanilla"] = t["vanilla"][-1:]
    _refused(t, "vanilla")


def test_a_summary_must_sum_up_its_steps(good):
    t = copy.deepcopy(good)
    t["records"][-1]["token_ids"] = t["records"][-1]["token_ids"][:-1]
    _refused(t, "sum up the steps")


@pytest.mark.parametrize("where, value", [
    (("settings", "seed"), 10**400), (("settings", "temperature"), 10**400),
    (("records", 1, "step_ms"), 10**400), (("records", 1, "tree", "q", 0), 10**400),
    (("records", -1, "seconds"), 10**400), (("records", 1, "bonus"), 10**400),
], ids=lambda v: v if isinstance(v, tuple) else "1e400")
def test_numbers_too_large_are_refused(good, where, value):
    t = copy.deepcopy(good)
    obj = t
    for key in where[:-1]:
        obj = obj[key]
    obj[where[-1]] = value
    _refused(t, "invalid trace")


def test_refusals_are_short_whatever_the_file_holds(good):
    t = copy.deepcopy(good)
    t["records"][1]["k" * 3_000_000] = 1                  # an unexpected field's name
    _refused(t, "invalid trace")
    t = copy.deepcopy(good)
    t["records"][1]["tree"]["k" * 3_000_000] = 1
    _refused(t, "invalid trace")
    t = copy.deepcopy(good)
    t["settings"]["k" * 3_000_000] = 1
    _refused(t, "invalid trace")
    t = copy.deepcopy(good)
    t["model"] = {"target": "x" * 3_000_000}
    _refused(t, "invalid trace")
    t = copy.deepcopy(good)
    t["records"][1]["method"] = "m" * 3_000_000
    _refused(t, "invalid trace")
