"""The public server's per-visitor bounds (app/ui/limits.py), against a real Gradio server on
127.0.0.1 with the tiny model, driven as a script would: a session flood must not take other
visitors' state, simultaneous joins must not overfill the queue, uploads are .json, bounded
and rate-limited, a connection that never finishes its request head is closed, and a paused
step-mode run ends when idle or when paused runs hold too much memory."""
from __future__ import annotations

import importlib.util
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from app.engine.engine import Engine
from app.ui import handlers
from app.ui.blocks import build_demo, launch_kwargs
from app.ui.limits import PublicLimits
from app.ui.session import Session
from app.ui.settings import AppContext, ServerConfig

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
QUEUE = 6
LIMITS = PublicLimits(sessions_max=16, sessions_per_client=5, new_sessions_per_minute=40, idle_s=3600,
                      uploads_per_minute=6, header_timeout_s=1.0, body_timeout_s=2.0, reap_every_s=0.2)


def _loadtest():
    spec = importlib.util.spec_from_file_location("loadtest", REPO / "scripts" / "loadtest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _SlowEngine(Engine):
    """The tiny engine at ~20 steps/s, so that one long run keeps the worker busy."""

    def generate(self, *args, **kwargs):
        inner = super().generate(*args, **kwargs)

        def paced():
            try:
                for event in inner:
                    time.sleep(0.05)
                    yield event
            finally:
                inner.close()

        return paced()


@pytest.fixture
def serve(tiny):
    """Start the app with the given public limits (one server per test: each test's sessions
    count against its own caps); yields a function returning (url, demo)."""
    demos = []

    def start(limits: PublicLimits = LIMITS):
        target, head = tiny
        config = ServerConfig(max_new_tokens=200, queue_size=QUEUE, update_interval_s=0.25, public_limits=limits)
        demo = build_demo(AppContext(_SlowEngine(target, head), config, "tiny test model"), demos={})
        _, url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True,
                                **launch_kwargs(config))
        demos.append(demo)
        return url, demo

    yield start
    for demo in demos:
        demo.close()


@pytest.fixture
def server(serve):
    return serve()


def test_a_session_flood_never_takes_another_visitors_run(server):
    """200 new sessions from one address, then 40 from 40 addresses (more than the server
    holds): the flood is refused (429: one address's rate; 503: every session in use) and
    each visitor who made a run before still replays it."""
    url, _ = server
    lt = _loadtest()
    one = lt.session_flood(url, flood=200, victims=3, addresses=1, prefix="10.66")
    assert one["victims_kept"] == 3, one
    assert one["accepted"] <= LIMITS.sessions_per_client and one["codes"].get(429, 0) >= 190, one
    many = lt.session_flood(url, flood=40, victims=2, addresses=40, prefix="10.77")
    assert many["victims_kept"] == 2, many
    assert many["codes"].get(503, 0) > 0, many


def test_simultaneous_joins_cannot_overfill_the_queue(serve):
    """40 /generate joins at one instant while the worker is busy: at most the queue's size
    are accepted, the rest refused as queue full, none fails otherwise."""
    url, _ = serve(PublicLimits(sessions_max=400))
    r = _loadtest().burst(url, n=40, busy_tokens=200)
    assert r["worker_busy_throughout"], r
    assert r["accepted"] <= QUEUE and r["refused"] == 40 - r["accepted"] and r["other"] == 0, r


def _upload(url: str, name: str, content: bytes, client: str):
    import httpx

    return httpx.post(url.rstrip("/") + "/gradio_api/upload", files={"files": (name, content)},
                      headers={"X-Forwarded-For": client}, timeout=30)


def test_uploads_are_json_bounded_and_rate_limited(server):
    url, demo = server
    ok = _upload(url, "trace.json", b'{"format": "eagle-lens-trace"}', "10.3.0.1")
    assert ok.status_code == 200 and ok.json()[0].endswith("trace.json") and os.path.isfile(ok.json()[0])
    exe = _upload(url, "payload.exe", b"MZ" + b"\0" * 1000, "10.3.0.1")
    assert exe.status_code == 415
    folder = demo.server_app.uploaded_file_dir
    assert not [f for _, _, names in os.walk(folder) for f in names if f.endswith(".exe")]
    big = _upload(url, "big.json", b" " * (ServerConfig().trace_max_bytes + 100 * 1024), "10.3.0.2")
    assert big.status_code == 413
    codes = [_upload(url, f"t{i}.json", b"{}", "10.3.0.3").status_code for i in range(LIMITS.uploads_per_minute + 3)]
    assert codes.count(200) == LIMITS.uploads_per_minute and codes.count(429) == 3, codes


def test_a_request_head_that_never_ends_is_closed(server):
    """Half a request head, then silence: the server closes the connection (the reaper's
    bound: header_timeout_s 1 s, checked every 0.2 s; the socket waits up to 60 s)."""
    url, _ = server
    host, port = url.split("//")[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"GET /config HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sock.settimeout(60)
        try:
            closed = sock.recv(1024) == b""
        except ConnectionResetError:
            closed = True
        except socket.timeout:
            closed = False
    assert closed
    with socket.create_connection((host, int(port))) as sock:      # a whole request is still answered
        sock.sendall(b"GET /config HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(60)
        assert sock.recv(64).startswith(b"HTTP/1.1 200")


# --- paused step-mode runs (handlers, no server) ------------------------------------------------

def _paused(ctx, prompt="w5 w17 w33 w90"):
    session = Session()
    list(handlers.generate(ctx, session, step_mode=True, prompt=prompt, method="dynamic", max_new_tokens=40,
                           temperature=0.0))
    assert session.stepper is not None
    return session


def test_paused_runs_end_when_idle_and_say_why(tiny):
    target, head = tiny
    ctx = AppContext(Engine(target, head), ServerConfig(public_limits=PublicLimits(paused_idle_s=60)), "tiny")
    session = _paused(ctx)
    stepper = session.stepper
    ctx.paused.sweep(now=time.monotonic() + 30)          # not idle long enough yet
    assert session.stepper is stepper
    list(handlers.step(ctx, session))                     # a Step restarts the clock
    ctx.paused.sweep(now=time.monotonic() + 61)
    assert session.stepper is None and stepper.gi_frame is None      # closed: its KV cache is free
    with pytest.raises(ValueError, match="ended after 1 minutes without a Step"):
        handlers.check_step(session)
    list(handlers.generate(ctx, session, prompt="w5 w17", method="vanilla", max_new_tokens=3, temperature=0.0))
    with pytest.raises(ValueError, match="Nothing to step"):   # a new run forgets the old message
        handlers.check_step(session)


def test_paused_runs_together_stay_under_the_memory_cap(tiny):
    """Each paused run holds its KV cache (``handlers.paused_run_bytes``); with room for two,
    a third pause ends the least recently stepped."""
    target, head = tiny
    probe = AppContext(Engine(target, head), ServerConfig(), "tiny")
    one = handlers.paused_run_bytes(probe, handlers.parse(probe, dict(prompt="w5 w17 w33 w90", method="dynamic",
                                                                      max_new_tokens=40, temperature=0.0)))
    assert one > 0
    ctx = AppContext(Engine(target, head), ServerConfig(public_limits=PublicLimits(paused_bytes_max=2 * one)), "tiny")
    a, b = _paused(ctx), _paused(ctx)
    list(handlers.step(ctx, a))                           # a was stepped after b: b is the oldest
    c = _paused(ctx)
    assert a.stepper is not None and c.stepper is not None and b.stepper is None
    assert ctx.paused.held_bytes <= 2 * one
    with pytest.raises(ValueError, match="to make room"):
        handlers.check_step(b)


def test_session_records_are_capped_in_bytes_evicting_idle_sessions_only(tiny):
    """Over the byte budget, the least recently used *idle* session with records goes; a
    session in use stays even when it is the largest."""
    import datetime

    from app.ui.limits import install_state_holder

    target, head = tiny
    ctx = AppContext(Engine(target, head), ServerConfig(), "tiny")
    run = Session()
    list(handlers.generate(ctx, run, prompt="w5 w17 w33 w90", method="dynamic", max_new_tokens=40, temperature=0.0))
    from app.ui.limits import session_bytes

    size = session_bytes(Session(steps=list(run.steps)))     # each session below holds this much
    assert size > 10_000
    demo = build_demo(ctx, demos={})

    class _App:
        from gradio.state_holder import StateHolder

        state_holder = StateHolder()

    holder = install_state_holder(_App, demo, PublicLimits(session_bytes_max=int(2.5 * size), idle_s=60))
    state_key = next(k for k, b in demo.blocks.items() if type(b).__name__ == "State")
    for sid in ("old-idle", "active", "new-idle", "newest"):
        holder[sid].state_data[state_key] = Session(steps=list(run.steps))
    long_ago = datetime.datetime.now() - datetime.timedelta(seconds=600)
    holder.time_last_used["old-idle"] = holder.time_last_used["new-idle"] = long_ago
    holder.session_data.move_to_end("old-idle", last=False)
    holder.session_data.move_to_end("active", last=False)        # least recent, but in use
    holder._bytes_checked = 0.0
    holder.update("newest")
    assert set(holder.session_data) == {"active", "newest"}      # 2 x size <= 2.5 x size
