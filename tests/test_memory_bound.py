"""The sessions' memory bound, as the server's RSS sees it: a real Gradio server on 127.0.0.1
(the tiny model; loading a trace runs no model), 16 sessions of one address each loading one
crafted trace of 300 steps x 256 nodes (~3.7 MB of JSON) through the public ``/load_trace``
API, as a script would. The address's share holds one such trace and refuses the rest; a
refused load must keep nothing, the server's RSS must grow by at most the sessions' budget
(256 MiB), and once the sessions end their memory must go back to the system."""
from __future__ import annotations

import gc
import json
import threading
import time

import psutil
import pytest

from app.engine.engine import Engine
from app.engine.events import StepEvent
from app.ui.blocks import build_demo, launch_kwargs
from app.ui.limits import MiB, PublicLimits, release_memory
from app.ui.settings import AppContext, ServerConfig
from tests.test_limits import LOOPBACK, _client, _load, _loadtest, _upload

pytestmark = pytest.mark.slow

SESSIONS = 16
STEPS, NODES = 300, 256


def _crafted(valid: bool = True) -> bytes:
    """The load test's crafted trace (``scripts/loadtest.py``), with each node's target
    probability and a three-letter text: ~3.7 MB. Not ``valid``: its summary does not sum up
    its steps, which the parse finds only after building every step."""
    trace = _loadtest().crafted_trace(STEPS, NODES)
    for record in trace["records"]:
        if record.get("tree"):
            record["tree"] = {**record["tree"], "p": [0.25] * NODES, "texts": ["www"] * NODES}
    if not valid:
        trace["records"][-1]["token_ids"][-1] = 7
    return json.dumps(trace).encode()


@pytest.fixture
def server(tiny):
    target, head = tiny
    config = ServerConfig(max_new_tokens=8, session_ttl_s=600, public_limits=PublicLimits(trusted_proxies=LOOPBACK))
    demo = build_demo(AppContext(Engine(target, head), config, "tiny test model"), demos={})
    _, url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, **launch_kwargs(config))
    yield url, demo, config
    demo.close()


def _rss() -> float:
    return psutil.Process().memory_info().rss / MiB


def _records_alive() -> int:
    """The crafted traces' step records alive in this process (the server's), without a
    collection first: what a refused load left in a reference cycle is counted. (Other tests'
    records, e.g. the shipped demos' cached traces, are not.)"""
    return sum(1 for o in gc.get_objects()
               if type(o) is StepEvent and o.tree is not None and len(o.tree) == NODES and o.tree.texts[0] == "www")


def _end_sessions(holder, ttl_s: float) -> None:
    """Let every session expire, as if its time to live had passed (``ttl_s`` is the real
    one, put back after), and wait until the server has handed their memory back."""
    releases = holder.releases
    holder.ttl_s = 1.0
    deadline = time.monotonic() + 30
    while (holder.session_data or not holder.released or holder.releases == releases) and time.monotonic() < deadline:
        time.sleep(0.2)
    holder.ttl_s = ttl_s


def test_sixteen_sessions_of_one_address_stay_within_the_memory_bound(server):
    url, demo, config = server
    body = _crafted()
    assert 3_600_000 < len(body) <= config.trace_max_bytes
    path = _upload(url, "crafted.json", body, "10.60.0.1").json()[0]
    holder = demo.server_app.state_holder
    assert holder.ttl_s == config.session_ttl_s                           # the visitor's State's time to live
    assert "replaying" in str(_load(_client(url, "10.60.0.2"), path)[0])    # warm-up: one-time imports and caches
    _end_sessions(holder, config.session_ttl_s)
    release_memory()
    before, held_before = _rss(), _records_alive()
    assert held_before == 0 and not holder.session_data

    peak, sampling = [before], [True]

    def sample():
        while sampling[0]:
            peak[0] = max(peak[0], _rss())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    client = _client(url, "10.60.0.3")
    answers = []
    for _ in range(SESSIONS):
        client.reset_session()                      # a new session of the same address
        try:
            answers.append(str(_load(client, path)[0])[:40])
        except Exception as exc:  # noqa: BLE001 — a refusal is the expected answer past the share
            answers.append(str(exc)[:60])
    sampling[0] = False
    sampler.join()
    held = _records_alive()
    grown = peak[0] - before
    assert sum("replaying" in a for a in answers) == 1, answers           # the share holds one such trace
    assert sum("runs open from this address hold" in a for a in answers) == SESSIONS - 1, answers
    numbers = f"RSS {before:.0f} -> peak {peak[0]:.0f} MiB (+{grown:.0f}), records alive +{held}"
    assert held <= STEPS, numbers                                         # a refused load keeps nothing
    assert grown <= PublicLimits().session_bytes_max / MiB, numbers

    _end_sessions(holder, config.session_ttl_s)
    after = _rss()
    numbers += f", {after:.0f} MiB once the sessions ended"
    assert not holder.session_data and holder.expired == SESSIONS + 1, numbers
    assert _records_alive() == 0, numbers
    assert after <= before + 32, numbers                                  # back near the baseline


def test_a_refused_load_keeps_nothing_and_a_load_past_the_share_is_not_parsed(server):
    """A 3.7 MB trace refused by the parse (its last record is wrong) leaves no step record
    alive, not even until the next full collection; once an address holds its share, its next
    load is refused for the share before the file is parsed (the same invalid file now gets
    the share's refusal, not the parse's)."""
    url, _, _ = server
    invalid = _upload(url, "invalid.json", _crafted(valid=False), "10.61.0.1").json()[0]
    valid = _upload(url, "valid.json", _crafted(), "10.61.0.1").json()[0]
    client = _client(url, "10.61.0.2")
    for _ in range(4):
        client.reset_session()
        with pytest.raises(Exception, match="sum up the steps"):
            _load(client, invalid)
    assert _records_alive() == 0
    client.reset_session()
    assert "replaying" in str(_load(client, valid)[0])
    client.reset_session()
    with pytest.raises(Exception, match="runs open from this address hold"):
        _load(client, invalid)
