"""Bounds that keep one visitor (or one script) from taking the public server from the others.

Gradio gives every browser session its own state and a bounded queue; left alone, a public
server still lets one client

* evict everyone: Gradio keeps the last N sessions and drops the least recently used, so a
  script that opens N new sessions (one request each) pushes every real visitor out;
* hold memory without bound: a paused step-mode run keeps its KV cache (tens of MB);
* overfill the queue: the queue's size is checked before the event's validator runs, and
  joins that arrive together all pass the check while the first is being validated;
* fill the disk with uploads, and hold connections open with headers that never end.

Each has a bound here, with the numbers in ``PublicLimits`` (README, "Public server limits"):

``BoundedStateHolder``   Gradio's session store with a byte budget besides the count, a cap on
                         sessions per client, a rate limit on each client's new sessions, and
                         eviction of *idle* sessions only (least recently used first): when
                         every session is active a new one is refused, none is displaced (and
                         a client over its own cap can displace only its own idle sessions).
``PausedRuns``           paused step-mode runs end after an idle time, and the oldest ends when
                         all of them together would hold more than a memory cap; the visitor
                         then reads why (``Session.expired``).
``bound_queue_joins``    the queue's cap counts the joins still being validated.
``LimitsMiddleware``     per-client identity for the above; uploads: size per request, .json
                         only, a per-client rate, and a disk budget over uploads and traces.
``reap_slow_connections`` closes connections whose request head (or body) does not arrive in
                         time; uvicorn, which Gradio runs, has no such timeout.

``app_kwargs(config)`` wires the middleware and a lifespan hook (which installs the session
store and starts the reaper) into Gradio's FastAPI app through ``launch(app_kwargs=...)``.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import json
import os
import threading
import time
import weakref
from collections import defaultdict, deque
from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class PublicLimits:
    # sessions (gr.State of every visitor)
    sessions_max: int = 400                 # sessions held at once, all clients
    session_bytes_max: int = 256 * MiB      # their runs' records together (estimate: ``session_bytes``)
    sessions_per_client: int = 64           # beyond: the client's own least recent idle session goes, else 429
    new_sessions_per_minute: int = 60       # per client (a classroom behind one address); more get 429
    idle_s: float = 300.0                   # unused this long: evictable when the server is full
    # paused step-mode runs (each holds a KV cache)
    paused_idle_s: float = 600.0            # ended after this long without a Step
    paused_bytes_max: int = 512 * MiB       # all paused runs' KV caches together
    # uploads (trace files) and the traces written for download
    upload_types: tuple = (".json",)
    uploads_per_minute: int = 20            # per client
    upload_disk_max: int = 512 * MiB        # uploads + traces on disk; oldest pruned, then refused
    # connections
    header_timeout_s: float = 10.0          # a request's head must arrive within this
    body_timeout_s: float = 120.0           # ... and its body within this
    reap_every_s: float = 1.0


# --- who is asking ------------------------------------------------------------------------------

CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("eagle_lens_client", default=None)


def client_of(scope) -> str | None:
    """The client's address. Behind a proxy on this host or a private network (a Space's),
    the last X-Forwarded-For entry: the one that proxy added, which a client cannot forge (an
    entry it sends itself comes before it). Anyone else is known by their own address."""
    peer = (scope.get("client") or (None,))[0]
    try:
        proxied = peer is not None and (ipaddress.ip_address(peer).is_private or ipaddress.ip_address(peer).is_loopback)
    except ValueError:
        proxied = False
    if proxied:
        for name, value in scope.get("headers") or ():
            if name == b"x-forwarded-for":
                last = value.decode("latin-1").split(",")[-1].strip()
                if last:
                    return last
    return peer


class RateLimit:
    """At most ``per_minute`` events per key in any 60 s."""

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self._times: dict[str, deque] = defaultdict(deque)
        self._lock = threading.Lock()

    def allow(self, key: str | None, now: float | None = None) -> bool:
        if key is None:
            return True
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._times[key]
            while times and now - times[0] > 60.0:
                times.popleft()
            if len(times) >= self.per_minute:
                return False
            times.append(now)
            if len(self._times) > 10_000:            # forget clients gone quiet
                for k in [k for k, t in self._times.items() if not t or now - t[-1] > 60.0]:
                    del self._times[k]
            return True


class Refused(Exception):
    """A request this server will not take now; ``status`` is its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# --- sessions -----------------------------------------------------------------------------------

def session_bytes(session) -> int:
    """An estimate of the memory a visitor's ``Session`` holds in step records: per step ~600
    bytes, per draft-tree node ~450 (nine Python lists of boxed numbers and a short text), and
    the texts. Cached per step count, so it costs nothing between runs."""
    from app.ui.session import Session

    if not isinstance(session, Session):
        return 0
    runs = [session.steps] + ([session.race_vanilla.steps] if session.race_vanilla is not None else [])
    key = tuple(len(r) for r in runs) + (id(session.steps),)
    if session._bytes_key != key:
        total = 0
        for steps in runs:
            for s in steps:
                total += 600 + len(s.text) + (450 * len(s.tree) + sum(map(len, s.tree.texts)) if s.tree else 0)
        session._bytes_key, session._bytes = key, total
    return session._bytes


def _sessions_in(state) -> list:
    from app.ui.session import Session

    return [v for v in getattr(state, "state_data", {}).values() if isinstance(v, Session)]


def _state_holder_class():
    from gradio.state_holder import StateHolder

    class BoundedStateHolder(StateHolder):
        """Gradio's ``StateHolder`` (session id -> that browser session's state) with this
        module's bounds. Gradio's own rule (keep the last ``capacity`` sessions) let a script
        evict every visitor; here a new session may displace only an idle one (the same
        client's own, once that client holds its cap)."""

        def __init__(self, limits: PublicLimits, old: StateHolder | None = None):
            super().__init__()
            self.limits = limits
            self.new_sessions = RateLimit(limits.new_sessions_per_minute)
            self.owner: dict[str, str | None] = {}
            self.refused = 0
            self.evicted = 0
            self._bytes_checked = 0.0
            if old is not None:       # keep what the server already holds
                self.session_data, self.time_last_used = old.session_data, old.time_last_used

        def set_blocks(self, blocks):
            super().set_blocks(blocks)
            self.capacity = self.limits.sessions_max

        def __getitem__(self, session_id: str):
            if session_id not in self.session_data:
                self._admit(session_id, CLIENT.get())
            return super().__getitem__(session_id)

        def update(self, session_id: str):
            with self.lock:
                if session_id in self.session_data:
                    self.session_data.move_to_end(session_id)
            now = time.monotonic()
            if now - self._bytes_checked > 1.0:      # at most once a second: a sum over sessions
                self._bytes_checked = now
                self._fit_bytes(keep=session_id)

        # -- the rules

        def _idle(self, sid: str, now) -> bool:
            last = self.time_last_used.get(sid)
            busy = any(s.busy for s in _sessions_in(self.session_data.get(sid)))
            return not busy and (last is None or (now - last).total_seconds() > self.limits.idle_s)

        def _admit(self, sid: str, client: str | None) -> None:
            import datetime

            with self.lock:
                if not self.new_sessions.allow(client):
                    self.refused += 1
                    raise Refused(429, f"too many new sessions from this address (at most "
                                       f"{self.limits.new_sessions_per_minute} a minute): wait a minute")
                now = datetime.datetime.now()
                own = [s for s in self.session_data if self.owner.get(s) == client] if client else []
                if client is not None and len(own) >= self.limits.sessions_per_client:
                    victim = next((s for s in own if self._idle(s, now)), None)   # the client's own
                    if victim is None:
                        self.refused += 1
                        raise Refused(429, f"too many sessions in use from this address (at most "
                                           f"{self.limits.sessions_per_client})")
                    self._evict(victim)
                elif len(self.session_data) >= self.limits.sessions_max:
                    victim = next((s for s in self.session_data if self._idle(s, now)), None)
                    if victim is None:
                        self.refused += 1
                        raise Refused(503, "the server is full (every session is in use): try again in a few minutes")
                    self._evict(victim)
                self.owner[sid] = client

        def _fit_bytes(self, keep: str) -> None:
            import datetime

            with self.lock:
                sizes = {sid: sum(session_bytes(s) for s in _sessions_in(st)) for sid, st in self.session_data.items()}
                total = sum(sizes.values())
                now = datetime.datetime.now()
                for sid in list(self.session_data):          # least recently used first
                    if total <= self.limits.session_bytes_max:
                        break
                    if sid != keep and sizes[sid] and self._idle(sid, now):
                        self._evict(sid)
                        total -= sizes[sid]

        def _evict(self, sid: str) -> None:
            """Drop a session (its delete callbacks run: a paused run is closed). Lock held."""
            self.evicted += 1
            state = self.session_data.pop(sid, None)
            self.time_last_used.pop(sid, None)
            self.owner.pop(sid, None)
            for session in _sessions_in(state):
                session.close()

    return BoundedStateHolder


def install_state_holder(app, blocks, limits: PublicLimits):
    """Put a ``BoundedStateHolder`` in place of the app's session store (before any visitor)."""
    holder = _state_holder_class()(limits, app.state_holder)
    holder.set_blocks(blocks)
    app.state_holder = holder
    return holder


# --- paused step-mode runs ----------------------------------------------------------------------

def kv_bytes(engine, prompt_tokens: int, max_new_tokens: int, tree_tokens: int) -> int:
    """Bytes of the KV caches a run allocates up front (target + head): the buffers are sized
    for prompt + answer + one tree (``Engine._prefill``)."""
    cfg = engine.target.model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    layers = cfg.num_hidden_layers + (1 if getattr(engine, "head", None) is not None else 0)
    element = engine.target.model.dtype.itemsize
    return 2 * layers * heads * head_dim * element * (prompt_tokens + max_new_tokens + tree_tokens + 1)


class PausedRuns:
    """Every paused step-mode run on the server, so that none is held for ever: one idle for
    ``paused_idle_s`` ends (a sweep every few seconds), and when the runs together would hold
    more than ``paused_bytes_max`` the least recently stepped ends. The visitor's next Step
    says why (``Session.expired``)."""

    IDLE_MESSAGE = ("Your paused step-mode run was ended after {minutes:g} minutes without a Step, to free the "
                    "memory it held on this shared server. Press Generate to start again.")
    MEMORY_MESSAGE = ("Your paused step-mode run was ended to make room for newer ones (paused runs on this "
                      "server may hold {mib} MiB together). Press Generate to start again.")

    def __init__(self, limits: PublicLimits):
        self.limits = limits
        self._runs: dict[int, list] = {}       # id(session) -> [weakref(session), bytes, last step (monotonic)]
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None
        self.expired = 0

    def hold(self, session, nbytes: int) -> None:
        """``session`` just paused a new run holding ``nbytes``; older ones may end to fit it."""
        with self._lock:
            self._runs[id(session)] = [weakref.ref(session), nbytes, time.monotonic()]
            self._start_sweeper()
        self._fit(keep=session)

    def touch(self, session) -> None:
        with self._lock:
            if id(session) in self._runs:
                self._runs[id(session)][2] = time.monotonic()

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(b for ref, b, _ in self._live())

    def _live(self):
        """The entries whose session still pauses a run (lock held); drops the others."""
        out = []
        for key, entry in list(self._runs.items()):
            session = entry[0]()
            if session is None or session.stepper is None:
                del self._runs[key]
            else:
                out.append(entry)
        return out

    def _end(self, session, message: str) -> None:
        if session.busy:
            return                  # a Step is running right now: it is not idle
        session.close()
        session.expired = message
        self.expired += 1

    def _fit(self, keep) -> None:
        with self._lock:
            entries = sorted(self._live(), key=lambda e: e[2])
        total = sum(e[1] for e in entries)
        for ref, nbytes, _ in entries:
            if total <= self.limits.paused_bytes_max:
                break
            session = ref()
            if session is not None and session is not keep:
                self._end(session, self.MEMORY_MESSAGE.format(mib=self.limits.paused_bytes_max // MiB))
                total -= nbytes

    def sweep(self, now: float | None = None) -> None:
        """End the runs paused longer than ``paused_idle_s``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [e[0]() for e in self._live() if now - e[2] > self.limits.paused_idle_s]
        for session in stale:
            if session is not None:
                self._end(session, self.IDLE_MESSAGE.format(minutes=self.limits.paused_idle_s / 60))

    def _start_sweeper(self) -> None:
        if self._sweeper is not None and self._sweeper.is_alive():
            return

        def loop():
            while True:
                time.sleep(min(10.0, max(0.05, self.limits.paused_idle_s / 4)))
                with contextlib.suppress(Exception):   # a sweep must never end the sweeper
                    self.sweep()

        self._sweeper = threading.Thread(target=loop, name="eagle-lens-paused-runs", daemon=True)
        self._sweeper.start()


# --- the queue ----------------------------------------------------------------------------------

def bound_queue_joins(queue) -> None:
    """Make Gradio's queue cap hold for joins that arrive together.

    ``Queue.push`` checks ``len(queue) >= max_size``, then awaits the event's validator, and
    only then appends the event: every join that arrives while a validator runs passes the
    same check (40 simultaneous joins: 37-40 accepted against a cap of 32). Here a join
    reserves its place before the first await (the event loop runs one coroutine at a time,
    so check and reservation are atomic) and the cap counts the reservations too.
    """
    push = queue.push
    pending = [0]

    async def bounded_push(body, request, username):
        if queue.max_size is not None and len(queue) + pending[0] >= queue.max_size:
            return False, f"Queue is full. Max size is {queue.max_size}.", "queue_full"
        pending[0] += 1
        try:
            return await push(body, request, username)
        finally:
            pending[0] -= 1

    queue.push = bounded_push


# --- uploads --------------------------------------------------------------------------------------

def disk_usage(folders) -> list[tuple[float, int, str]]:
    """(mtime, size, path) of every file under ``folders``."""
    files = []
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    files.append((st.st_mtime, st.st_size, path))
    return files


def make_room(folders, budget: int, min_age_s: float = 60.0) -> bool:
    """Delete the oldest files (each older than ``min_age_s``: a trace just written for a
    download stays) until the folders hold at most ``budget`` bytes; True if they then do."""
    files = sorted(disk_usage(folders))
    total = sum(size for _, size, _ in files)
    cutoff = time.time() - min_age_s
    for mtime, size, path in files:
        if total <= budget:
            break
        if mtime < cutoff:
            with contextlib.suppress(OSError):
                os.remove(path)
                total -= size
    return total <= budget


class LimitsMiddleware:
    """ASGI middleware: sets ``CLIENT`` for the request, answers ``Refused`` with its status,
    and bounds uploads (Gradio's ``/upload`` takes any file type, and keeps it an hour)."""

    def __init__(self, app, limits: PublicLimits, max_file_bytes: int, trace_dirs=()):
        self.app, self.limits = app, limits
        self.max_request_bytes = max_file_bytes + 64 * 1024       # one file and its multipart framing
        self.trace_dirs = tuple(trace_dirs)
        self.uploads = RateLimit(limits.uploads_per_minute)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        token = CLIENT.set(client_of(scope))
        try:
            if scope["method"] == "POST" and scope["path"].rstrip("/").endswith("/upload"):
                await self._upload(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        except Refused as exc:
            await _reply(send, exc.status, str(exc))
        finally:
            CLIENT.reset(token)

    async def _upload(self, scope, receive, send):
        headers = dict(scope.get("headers") or ())
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_request_bytes):
            raise Refused(413, f"an upload may be at most {self.max_request_bytes} bytes")
        if not self.uploads.allow(CLIENT.get()):
            raise Refused(429, f"too many uploads from this address (at most {self.limits.uploads_per_minute} a minute)")
        folders = [scope["app"].uploaded_file_dir, *self.trace_dirs]
        if not await asyncio.to_thread(make_room, [f for f in folders if os.path.isdir(f)],
                                       self.limits.upload_disk_max - self.max_request_bytes):
            raise Refused(507, "the server's upload space is full: try again later")

        received = [0]

        async def counted_receive():
            message = await receive()
            if message["type"] == "http.request":
                received[0] += len(message.get("body", b""))
                if received[0] > self.max_request_bytes:
                    return {"type": "http.disconnect"}          # the parser fails: nothing is kept
            return message

        start, body = None, []

        async def held_send(message):          # hold the (small) answer until its file names are checked
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            body.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._answer(start, b"".join(body), send)

        await self.app(scope, counted_receive, held_send)

    async def _answer(self, start, body: bytes, send):
        if start is not None and start["status"] == 200:
            try:
                paths = json.loads(body)
            except ValueError:
                paths = []
            wrong = [p for p in paths if isinstance(p, str) and not p.lower().endswith(self.limits.upload_types)]
            if wrong:
                for p in paths:
                    with contextlib.suppress(OSError, TypeError):
                        os.remove(p)
                await _reply(send, 415, f"only {', '.join(self.limits.upload_types)} files can be uploaded here")
                return
        await send(start)
        await send({"type": "http.response.body", "body": body})


async def _reply(send, status: int, message: str):
    body = json.dumps({"detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# --- slow connections -----------------------------------------------------------------------------

async def reap_slow_connections(get_server, limits: PublicLimits) -> None:
    """Close HTTP connections whose request head has not arrived within ``header_timeout_s``
    (or whose body has not within ``body_timeout_s``).

    uvicorn arms its keep-alive timer only after a response: a connection that sends half a
    request head (or one byte a minute) is held for ever, and enough of them exhaust the
    server. A request head is complete when h11 has parsed it: the client's state leaves
    IDLE. The head's clock starts when the connection is first seen waiting, so an idle
    keep-alive connection is closed too (uvicorn's own 5 s timer usually does that first).
    Runs on the server's event loop, where transports may be closed.
    """
    import h11

    since: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    while True:
        await asyncio.sleep(limits.reap_every_s)
        server = get_server()
        if server is None:
            continue
        now = time.monotonic()
        for proto in list(getattr(server, "server_state", None).connections if server else ()):
            conn = getattr(proto, "conn", None)
            if not isinstance(conn, h11.Connection):
                continue             # a WebSocket, or another protocol: not ours to judge
            state = conn.their_state
            if state is h11.IDLE:
                limit = limits.header_timeout_s
            elif state is h11.SEND_BODY:
                limit = limits.body_timeout_s
            else:
                since.pop(proto, None)
                continue
            key = (state, id(getattr(proto, "cycle", None)))
            first = since.get(proto)
            if first is None or first[0] != key:
                since[proto] = (key, now)
            elif now - first[1] > limit and not proto.transport.is_closing():
                proto.transport.close()


# --- wiring ---------------------------------------------------------------------------------------

def app_kwargs(config, trace_dirs=()) -> dict:
    """For ``demo.launch(app_kwargs=...)``: the middleware, and a lifespan hook that installs
    the session store and starts the connection reaper once Gradio's app exists."""
    from starlette.middleware import Middleware

    limits = config.public_limits

    @contextlib.asynccontextmanager
    async def lifespan(app):
        blocks = app.get_blocks()
        install_state_holder(app, blocks, limits)
        reaper = asyncio.get_running_loop().create_task(
            reap_slow_connections(lambda: getattr(blocks, "server", None), limits))
        try:
            yield
        finally:
            reaper.cancel()

    return {"middleware": [Middleware(LimitsMiddleware, limits=limits, max_file_bytes=config.trace_max_bytes,
                                      trace_dirs=trace_dirs)],
            "lifespan": lifespan}
