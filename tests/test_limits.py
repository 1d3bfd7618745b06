"""The public server's per-visitor bounds (app/ui/limits/), against a real Gradio server on
127.0.0.1 with the tiny model, driven as a script would: a session flood must not take other
visitors' state, simultaneous joins must not overfill the queue, uploads are .json, bounded
and rate-limited, a connection that never finishes its request head is closed, and a paused
step-mode run ends when idle or when paused runs hold too much memory."""
from __future__ import annotations

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
from tests.scripts import load_script

pytestmark = pytest.mark.slow

QUEUE = 6
LOOPBACK = "127.0.0.1"      # the tests play many clients through X-Forwarded-For from a trusted loopback proxy
LIMITS = PublicLimits(sessions_max=16, sessions_per_client=5, new_sessions_per_minute=40, idle_s=3600,
                      uploads_per_minute=6, header_timeout_s=1.0, body_timeout_s=2.0, reap_every_s=0.2,
                      trusted_proxies=LOOPBACK)


def _loadtest():
    return load_script("loadtest")


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
    url, _ = serve(PublicLimits(sessions_max=400, trusted_proxies=LOOPBACK))
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
    for sid in ("old-idle", "active", "new-idle", "newest"):      # admitted while empty, then filled
        holder[sid]
    for sid in ("old-idle", "active", "new-idle", "newest"):
        holder[sid].state_data[state_key] = Session(steps=list(run.steps))
    long_ago = datetime.datetime.now() - datetime.timedelta(seconds=600)
    holder.time_last_used["old-idle"] = holder.time_last_used["new-idle"] = long_ago
    holder.session_data.move_to_end("old-idle", last=False)
    holder.session_data.move_to_end("active", last=False)        # least recent, but in use
    holder._bytes_checked = 0.0
    holder.update("newest")
    assert set(holder.session_data) == {"active", "newest"}      # 2 x size <= 2.5 x size


# --- bounds that hold while sessions are active -------------------------------------------------

def _big_trace(tiny, tmp_path, steps: int = 40) -> Path:
    """A valid trace of ``steps`` steps of 48-node trees (as anyone can craft one)."""
    import json

    from app.ui import traces

    target, head = tiny
    session = Session()
    ctx = AppContext(Engine(target, head), ServerConfig(), "tiny")
    list(handlers.generate(ctx, session, prompt="w5 w17 w33 w90", method="dynamic", max_new_tokens=steps,
                           temperature=0.0, depth=6, top_k=8, total_tokens=48, race=False))
    data = traces.trace_dict(session.settings, session.model, session.steps, session.summary)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(data))
    return path


def _client(url: str, address: str):
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False, headers={"X-Forwarded-For": address})


def _load(client, server_path: str):
    return client.predict({"path": server_path, "meta": {"_type": "gradio.FileData"}}, api_name="/load_trace")


def test_run_memory_caps_bind_active_sessions(serve, tiny, tmp_path):
    """One uploaded trace loaded from many new sessions: one address gets its share of the
    record budget (then its loads and new sessions are refused with a message, 429), all
    addresses together the server's (then 503); a visitor from elsewhere still works while
    those sessions stay active."""
    from gradio_client.exceptions import AppError

    from app.ui import traces
    from app.ui.limits import session_bytes

    path = _big_trace(tiny, tmp_path)
    size = session_bytes(Session(steps=list(traces.parse_trace(path.read_bytes()).steps)))   # one loaded copy
    limits = PublicLimits(sessions_max=100, sessions_per_client=50, new_sessions_per_minute=100, idle_s=3600,
                          session_bytes_per_client=int(2.5 * size), session_bytes_max=int(4.5 * size),
                          trusted_proxies=LOOPBACK)
    url, demo = serve(limits)
    server_path = _upload(url, "big.json", path.read_bytes(), "10.8.0.1").json()[0]
    held = []
    for i in range(2):                                     # 10.8.0.1's share: two runs
        c = _client(url, "10.8.0.1")
        assert "replaying" in str(_load(c, server_path)[0])
        held.append(c)
    with pytest.raises(AppError, match="runs open from this address hold"):
        _load(_client(url, "10.8.0.1"), server_path)
    for i in range(2):                                     # the server's: four runs in all
        c = _client(url, f"10.8.1.{i + 1}")
        assert "replaying" in str(_load(c, server_path)[0])
        held.append(c)
    with pytest.raises(AppError, match="memory for runs is full"):
        _load(_client(url, "10.8.2.1"), server_path)
    holder = demo.server_app.state_holder
    assert sum(limits_bytes(holder).values()) <= limits.session_bytes_max
    out = _client(url, "10.8.3.1").predict(prompt="w5 w17", method="vanilla", max_new_tokens=3, temperature=0.0,
                                           api_name="/generate")
    assert str(out[0]).startswith("done")                  # a visitor's own (small) run still works


def limits_bytes(holder) -> dict:
    from app.ui.limits import _sessions_in, session_bytes

    return {sid: sum(session_bytes(s) for s in _sessions_in(st)) for sid, st in holder.session_data.items()}


def test_request_bodies_are_capped_before_parsing(serve):
    """A body over ``body_bytes_max`` is refused with 413 whether it says its length or not
    (chunked), and the server still answers."""
    import httpx

    url, _ = serve(PublicLimits(body_bytes_max=64 * 1024, trusted_proxies=LOOPBACK))
    join = url.rstrip("/") + "/gradio_api/queue/join"
    body = b'{"data": ["' + b"x" * 200_000 + b'"], "fn_index": 0, "session_hash": "abc"}'
    r = httpx.post(join, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and len(r.text) < 200

    def chunks():
        for i in range(0, len(body), 8192):
            yield body[i:i + 8192]

    r = httpx.post(join, content=chunks(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413
    assert httpx.get(url.rstrip("/") + "/config", timeout=30).status_code == 200


def test_each_client_has_a_share_of_the_queue(serve):
    """While the worker is busy, one address may have ``queued_per_client`` runs waiting; its
    next is refused with a message, and another address still gets in."""
    import uuid

    import httpx
    from gradio_client import Client

    from app.engine.spec import SETTING
    from app.ui.requests import SETTING_NAMES

    url, _ = serve(PublicLimits(queued_per_client=2, trusted_proxies=LOOPBACK))
    lt = _loadtest()
    busy = Client(url, verbose=False, download_files=False, headers={"X-Forwarded-For": "10.9.9.9"})
    job = busy.submit(prompt="w5 w17", method="vanilla", max_new_tokens=200, temperature=0.0, api_name="/generate")
    while job.status().code.name not in ("PROCESSING", "ITERATING", "FINISHED"):
        time.sleep(0.05)
    settings = dict(prompt="w5 w17", method="vanilla", max_new_tokens=2, temperature=0.0)
    data = [settings.get(k, SETTING[k].default) for k in SETTING_NAMES] + [False, True, None]
    generate = lt.endpoint_ids(url)["generate"]
    answers = []
    with httpx.Client() as http:
        codes = [lt.raw_join(http, url, generate, data, uuid.uuid4().hex[:11], "10.9.0.1", answers) for _ in range(3)]
        other = lt.raw_join(http, url, generate, data, uuid.uuid4().hex[:11], "10.9.0.2")
    assert job.status().code.name != "FINISHED"            # nothing left the queue meanwhile
    job.cancel()
    busy.predict(api_name="/stop")
    assert codes[:2] == [200, 200] and codes[2] != 200 and "runs waiting" in answers[2], (codes, answers[2])
    assert other == 200


def test_open_streams_per_client_are_capped(serve):
    """Heartbeat connections held open from one address: beyond ``streams_per_client`` the
    next is refused (429); another address still connects."""
    import contextlib

    import httpx

    url, _ = serve(PublicLimits(streams_per_client=3, trusted_proxies=LOOPBACK))
    base = url.rstrip("/") + "/gradio_api/heartbeat/"
    with httpx.Client(timeout=30) as http, contextlib.ExitStack() as held:
        codes = [held.enter_context(http.stream("GET", base + uuid.uuid4().hex[:11],
                                                headers={"X-Forwarded-For": "10.10.0.1"})).status_code
                 for _ in range(4)]
        other = held.enter_context(http.stream("GET", base + uuid.uuid4().hex[:11],
                                               headers={"X-Forwarded-For": "10.10.0.2"})).status_code
    assert codes == [200, 200, 200, 429] and other == 200, codes


def test_polls_for_unknown_sessions_are_answered_briefly_and_rate_limited(serve, capfd):
    import httpx

    url, _ = serve(PublicLimits(unknown_polls_per_minute=5, trusted_proxies=LOOPBACK))
    data = url.rstrip("/") + "/gradio_api/queue/data"
    codes = [httpx.get(data, params={"session_hash": f"nobody{i}"}, headers={"X-Forwarded-For": "10.11.0.1"},
                       timeout=30) for i in range(7)]
    assert [r.status_code for r in codes] == [404] * 5 + [429] * 2
    assert all(len(r.text) < 200 for r in codes)
    assert "Traceback" not in capfd.readouterr().err


def test_each_test_process_counts_uploads_in_a_folder_of_its_own():
    """The upload-budget tests measure what Gradio's temporary folder holds, then upload: a
    second pytest-xdist worker sharing that folder changes it in between. Each process makes
    its own unless the user set GRADIO_TEMP_DIR."""
    folder = os.environ["GRADIO_TEMP_DIR"]
    if folder != os.environ.get("EAGLE_LENS_TEST_GRADIO_TEMP_DIR"):
        pytest.skip("GRADIO_TEMP_DIR set by the user: theirs to share")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert os.path.basename(folder).startswith(f"gradio-{worker}-"), (worker, folder)


def test_only_the_apps_own_uploads_are_pruned(serve):
    """Uploads go to the app's own folder; when the upload space is over budget the oldest of
    *its* files go, never another file in Gradio's shared temporary folder."""
    from gradio.utils import get_upload_folder

    from app.ui.limits import TRACE_PREFIX, UPLOAD_FOLDER, disk_usage

    own = [os.path.join(get_upload_folder(), UPLOAD_FOLDER), (handlers.TRACE_DIR, TRACE_PREFIX)]
    held = sum(size for _, size, _ in disk_usage(own))        # what the app's folders hold now
    url, demo = serve(PublicLimits(upload_disk_max=ServerConfig().trace_max_bytes + 64 * 1024 + held + 3000,
                                   trusted_proxies=LOOPBACK))
    old = 0                                                     # older than anything: pruned first
    foreign = Path(get_upload_folder()) / f"another-app-{uuid.uuid4().hex[:8]}.bin"
    foreign.parent.mkdir(parents=True, exist_ok=True)
    foreign.write_bytes(b"x" * 5000)
    os.utime(foreign, (old, old))
    try:
        first = _upload(url, "a.json", b"{" + b" " * 4000 + b"}", "10.12.0.1")
        assert first.status_code == 200
        mine = first.json()[0]
        assert Path(mine).resolve().is_relative_to(Path(demo.server_app.uploaded_file_dir).resolve())
        os.utime(mine, (old, old))
        assert _upload(url, "b.json", b"{}", "10.12.0.1").status_code == 200
        assert not os.path.exists(mine)                    # the app's own old upload went
        assert foreign.exists()                            # another app's file stayed
    finally:
        foreign.unlink(missing_ok=True)


@pytest.mark.parametrize("spec, peer, forwarded, client", [
    ("", "127.0.0.1", "10.0.0.9", "127.0.0.1"),              # no proxy trusted: the peer, header ignored
    ("", "10.1.2.3", "6.6.6.6", "10.1.2.3"),                 # a private peer is not trusted by default
    ("0", "10.1.2.3", "6.6.6.6", "10.1.2.3"),
    ("1", "10.1.2.3", "6.6.6.6, 8.8.8.8", "8.8.8.8"),        # one hop: the entry the proxy added
    ("2", "10.1.2.3", "6.6.6.6, 8.8.8.8, 10.0.0.5", "8.8.8.8"),
    ("2", "10.1.2.3", "8.8.8.8", "10.1.2.3"),                # fewer entries than hops: the peer
    ("10.0.0.0/8", "10.1.2.3", "6.6.6.6, 8.8.8.8, 10.0.0.5", "8.8.8.8"),   # walk back over trusted proxies
    ("10.0.0.0/8", "192.168.1.1", "8.8.8.8", "192.168.1.1"),  # a peer outside the list: itself
])
def test_trusted_proxies_decide_who_the_client_is(spec, peer, forwarded, client):
    from app.ui.limits import client_of, trusted_proxies

    scope = {"client": (peer, 1234), "headers": [(b"x-forwarded-for", forwarded.encode())]}
    assert client_of(scope, trusted_proxies(spec)) == client


def test_a_bad_trusted_proxies_setting_fails_at_start(monkeypatch):
    monkeypatch.setenv("EAGLE_LENS_TRUSTED_PROXIES", "everyone")
    with pytest.raises(ValueError, match="trusted_proxies"):
        ServerConfig.from_env()
    monkeypatch.setenv("EAGLE_LENS_TRUSTED_PROXIES", "10.0.0.1/8")     # host bits set: address or network?
    with pytest.raises(ValueError, match="host bits zero"):
        ServerConfig.from_env()
    monkeypatch.delenv("EAGLE_LENS_TRUSTED_PROXIES")
    monkeypatch.setenv("SPACE_ID", "someone/eagle-lens")
    assert ServerConfig.from_env().public_limits.trusted_proxies == "1"     # a Space's proxy: one hop
