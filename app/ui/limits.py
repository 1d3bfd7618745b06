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
    session_bytes_per_client: int = 64 * MiB  # one address's sessions together; beyond, new sessions and trace loads are refused
    idle_s: float = 300.0                   # unused this long: evictable when the server is full
    # paused step-mode runs (each holds a KV cache)
    paused_idle_s: float = 600.0            # ended after this long without a Step
    paused_bytes_max: int = 512 * MiB       # all paused runs' KV caches together
    # uploads (trace files) and the traces written for download
    upload_types: tuple = (".json",)
    uploads_per_minute: int = 20            # per client
    upload_disk_max: int = 512 * MiB        # uploads + traces on disk; oldest pruned, then refused
    # the queue
    queued_per_client: int = 2              # an address's events waiting for one worker (the engine's) at once
    # requests and connections
    body_bytes_max: int = 1 * MiB           # any request but an upload: refused (413) before it is parsed
    streams_per_client: int = 128           # open event streams and heartbeats of one address
    unknown_polls_per_minute: int = 30      # polls for sessions the queue does not know, per address (then 429)
    trusted_proxies: str = ""               # "" none; "N": N proxy hops; "a, b/24": the proxies' addresses
    header_timeout_s: float = 10.0          # a request's head must arrive within this
    body_timeout_s: float = 120.0           # ... and its body within this
    reap_every_s: float = 1.0


# --- who is asking ------------------------------------------------------------------------------

CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("eagle_lens_client", default=None)


def trusted_proxies(spec: str) -> tuple[int, tuple]:
    """(hops, networks) of a ``trusted_proxies`` setting: "" trusts no proxy, "N" the last N
    hops whatever their address (a platform's proxies that every request passes through),
    "10.0.0.1, 10.1.0.0/16" the peers with these addresses (and X-Forwarded-For entries they
    added). ValueError for anything else."""
    spec = (spec or "").strip()
    if not spec:
        return 0, ()
    if spec.isdigit():
        if not 0 <= int(spec) <= 8:
            raise ValueError(f"trusted_proxies: at most 8 hops, got {spec}")
        return int(spec), ()
    try:
        return 0, tuple(ipaddress.ip_network(part.strip(), strict=False) for part in spec.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"trusted_proxies must be a hop count or a list of addresses / networks, got {spec[:80]!r}") from None


def _in(address: str | None, networks) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except (TypeError, ValueError):
        return False
    return any(ip in net for net in networks)


def client_of(scope, trusted: tuple[int, tuple] = (0, ())) -> str | None:
    """The client's address: the peer's own, unless the peer is a trusted proxy (``trusted``,
    from ``trusted_proxies``); then the X-Forwarded-For entry that the outermost trusted proxy
    added. Entries a client sends itself come before those, so they cannot be forged."""
    peer = (scope.get("client") or (None,))[0]
    hops, networks = trusted
    if not hops and not (networks and _in(peer, networks)):
        return peer
    entries = []
    for name, value in scope.get("headers") or ():
        if name == b"x-forwarded-for":
            entries += [e.strip() for e in value.decode("latin-1").split(",")]
    entries = [e[:64] for e in entries if e]
    if hops:                                  # the entry the outermost of ``hops`` proxies added
        return entries[-hops] if len(entries) >= hops else peer
    for entry in reversed(entries):           # walk back over the trusted proxies
        if not _in(entry, networks):
            return entry
    return entries[0] if entries else peer


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


class Refused(ValueError):
    """A request this server will not take now; ``status`` is its HTTP status. A ValueError,
    so that inside an event the page shows its message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# --- sessions -----------------------------------------------------------------------------------

def session_bytes(session) -> int:
    """An estimate of the memory a visitor's ``Session`` holds in step records: per step ~600
    bytes, per draft-tree node ~450 (nine Python lists of boxed numbers and a short text), and
    the texts. A shipped demo's records are shared by every session showing it (parsed once)
    and count nothing. Cached per step count, so it costs nothing between runs."""
    from app.ui.session import Session

    if not isinstance(session, Session):
        return 0
    runs = [session.steps] + ([session.race_vanilla.steps] if session.race_vanilla is not None else [])
    key = tuple(len(r) for r in runs) + (id(session.steps), session.records_shared)
    if session._bytes_key != key:
        session._bytes_key, session._bytes = key, 0 if session.records_shared else sum(map(records_bytes, runs))
    return session._bytes


def records_bytes(steps) -> int:
    """``session_bytes``' estimate for one run's step records."""
    total = 0
    for s in steps:
        total += 600 + len(s.text) + (450 * len(s.tree) + sum(map(len, s.tree.texts)) if s.tree else 0)
    return total


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
            self.released = True
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
                self._fit_records(client, 0, now)
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

        def _sizes(self) -> dict:
            return {sid: sum(session_bytes(s) for s in _sessions_in(st)) for sid, st in self.session_data.items()}

        def _fit_records(self, client: str | None, nbytes: int, now, keep: str | None = None) -> None:
            """Make room for ``nbytes`` more of run records from ``client`` (session ``keep``'s
            records are about to be replaced: they do not count) by evicting idle sessions, the
            client's own first; Refused (429: this address's share; 503: the server's) when
            active sessions alone leave no room. Lock held."""
            sizes = self._sizes()
            if keep is not None:
                sizes[keep] = 0
            limits = self.limits
            if client is not None:
                own = [s for s in self.session_data if self.owner.get(s) == client]
                held = sum(sizes[s] for s in own)
                for sid in own:
                    if held + nbytes <= limits.session_bytes_per_client or held == 0:
                        break
                    if sid != keep and sizes[sid] and self._idle(sid, now):
                        self._evict(sid)
                        held -= sizes.pop(sid)
                if held and held + nbytes > limits.session_bytes_per_client:
                    self.refused += 1
                    raise Refused(429, f"the runs open from this address hold {held / MiB:.1f} MiB (at most "
                                       f"{limits.session_bytes_per_client / MiB:.1f} MiB together): close a tab or "
                                       f"try again in a few minutes")
            total = sum(sizes.values())
            for sid in list(self.session_data):                # least recently used first
                if total + nbytes <= limits.session_bytes_max:
                    break
                if sid != keep and sizes.get(sid) and self._idle(sid, now):
                    self._evict(sid)
                    total -= sizes.pop(sid)
            if total + nbytes > limits.session_bytes_max:
                self.refused += 1
                raise Refused(503, f"the server's memory for runs is full ({limits.session_bytes_max / MiB:.1f} MiB "
                                   f"held by visitors using it now): try again in a few minutes")

        def admit_records(self, sid: str, nbytes: int) -> None:
            """Before session ``sid`` takes a run of ``nbytes`` (a loaded trace): room within
            its address's share and the server's budget, or Refused."""
            import datetime

            with self.lock:
                self._fit_records(self.owner.get(sid), nbytes, datetime.datetime.now(), keep=sid)

        def _fit_bytes(self, keep: str) -> None:
            import datetime

            with self.lock:
                sizes = self._sizes()
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
            self.released = False            # the reaper hands the freed memory back (release_memory)

    return BoundedStateHolder


def admit_records(app, session_hash: str | None, nbytes: int) -> None:
    """Refused unless the session ``session_hash`` of ``app`` may take ``nbytes`` more of run
    records (``BoundedStateHolder.admit_records``); nothing to check without the bounded store."""
    holder = getattr(app, "state_holder", None)
    if session_hash and hasattr(holder, "admit_records"):
        holder.admit_records(session_hash, nbytes)


def release_memory() -> None:
    """Hand memory freed by ended sessions back to the system: a full collection, then glibc's
    ``malloc_trim`` (Python's small-object arenas and glibc keep freed pages otherwise, and
    the process's RSS stays at its peak)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)


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

def bound_queue_joins(queue, limits: PublicLimits | None = None) -> None:
    """Make Gradio's queue cap hold for joins that arrive together, and give each client a
    share of it.

    ``Queue.push`` checks ``len(queue) >= max_size``, then awaits the event's validator, and
    only then appends the event: every join that arrives while a validator runs passes the
    same check (40 simultaneous joins: 37-40 accepted against a cap of 32). Here a join
    reserves its place before the first await (the event loop runs one coroutine at a time,
    so check and reservation are atomic) and the cap counts the reservations too.

    A client (``CLIENT``, set by ``LimitsMiddleware`` for the join's request) may have at most
    ``limits.queued_per_client`` events waiting for the same worker (its reservations
    included): one visitor's runs cannot fill the queue ahead of everyone else.
    """
    push = queue.push
    pending = [0]
    per_client = limits.queued_per_client if limits is not None else None
    reserved: dict = defaultdict(int)          # (client, concurrency id) -> joins being validated

    def waiting(client, concurrency_id) -> int:
        q = queue.event_queue_per_concurrency_id.get(concurrency_id)
        events = q.queue if q is not None else ()
        return sum(getattr(e, "eagle_lens_client", None) == client for e in events) + reserved[(client, concurrency_id)]

    async def bounded_push(body, request, username):
        if queue.max_size is not None and len(queue) + pending[0] >= queue.max_size:
            return False, f"Queue is full. Max size is {queue.max_size}.", "queue_full"
        client = CLIENT.get()
        key = None
        if per_client is not None and client is not None:
            try:
                from gradio import route_utils

                concurrency_id = route_utils.get_fn(queue.blocks, None, body).concurrency_id
            except Exception:  # noqa: BLE001 — an unknown fn: Gradio's own push answers it
                concurrency_id = None
            if concurrency_id is not None:
                if waiting(client, concurrency_id) >= per_client:
                    return (False, f"You already have {per_client} runs waiting: wait for them to finish (a "
                                   f"visitor may queue at most {per_client}).", "queue_full")
                key = (client, concurrency_id)
                reserved[key] += 1
        pending[0] += 1
        try:
            ok, event_id, kind = await push(body, request, username)
            event = queue.event_ids_to_events.get(event_id) if ok and isinstance(event_id, str) else None
            if event is not None:
                event.eagle_lens_client = client
            return ok, event_id, kind
        finally:
            pending[0] -= 1
            if key is not None:
                reserved[key] -= 1
                if not reserved[key]:
                    del reserved[key]

    queue.push = bounded_push


# --- uploads --------------------------------------------------------------------------------------

UPLOAD_FOLDER = "eagle-lens-uploads"      # the app's own, inside Gradio's temporary folder
TRACE_PREFIX = "eagle-lens-trace-"       # the traces written for download (handlers.write_trace)


def gradio_temp_folder() -> str:
    """Gradio's temporary folder by Gradio's own rule ($GRADIO_TEMP_DIR, else <tmp>/gradio),
    without importing Gradio (``own_upload_folder`` checks it against Gradio's at launch)."""
    import tempfile
    from pathlib import Path

    return os.environ.get("GRADIO_TEMP_DIR") or str((Path(tempfile.gettempdir()) / "gradio").resolve())


def upload_folder() -> str:
    """The app's own folder: the visitors' uploads and the traces written for download.

    Gradio serves a file only from its upload folder (``app.uploaded_file_dir``, this one once
    ``own_upload_folder`` ran) or a path allowed at launch; a file returned from an event that
    is outside Gradio's temporary folder is first copied into that folder's top (outside this
    one), where it would not be served. A trace written here is served as it is, and counted
    and pruned with the uploads."""
    return os.path.join(gradio_temp_folder(), UPLOAD_FOLDER)


def disk_usage(folders) -> list[tuple[float, int, str]]:
    """(mtime, size, path) of every file under ``folders``, each a folder or (folder, name
    prefix): only the files whose name starts with the prefix. A file under two of the
    folders (the traces' folder inside the uploads') is listed once."""
    files, seen = [], set()
    for folder in folders:
        folder, prefix = folder if isinstance(folder, tuple) else (folder, "")
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                if not name.startswith(prefix) or os.path.realpath(path) in seen:
                    continue
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    files.append((st.st_mtime, st.st_size, path))
                    seen.add(os.path.realpath(path))
    return files


def make_room(folders, budget: int, min_age_s: float = 60.0) -> bool:
    """Delete the oldest files (each older than ``min_age_s``: a trace just written for a
    download stays) until the folders hold at most ``budget`` bytes; True if they then do.
    Only files under ``folders`` (``disk_usage``) are counted and deleted."""
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


def own_upload_folder(app, trace_dirs=()) -> str:
    """Point Gradio's uploads at the app's own folder (``upload_folder``), so that pruning it
    never touches another app's files or Gradio's cached copies. Gradio serves only the files
    in that folder: a folder of traces for download (``trace_dirs``) must lie inside it, or
    every download would be refused (RuntimeError here, at launch, instead)."""
    from gradio.utils import get_upload_folder

    folder = os.path.join(get_upload_folder(), UPLOAD_FOLDER)
    wrong = [d for d in trace_dirs if not _inside(d, folder)]
    if wrong:
        raise RuntimeError(f"traces for download are written to {wrong[0]}, outside the folder Gradio serves "
                           f"files from ({folder}): write them under limits.upload_folder()")
    os.makedirs(folder, exist_ok=True)
    app.uploaded_file_dir = folder
    return folder


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def _is_stream(path: str) -> bool:
    return path.rstrip("/").endswith("/queue/data") or "/heartbeat/" in path


class LimitsMiddleware:
    """ASGI middleware: sets ``CLIENT`` for the request, answers ``Refused`` with its status,
    caps every request's body before it is parsed, caps each client's open streams, answers
    polls for unknown sessions briefly (rate-limited), and bounds uploads (Gradio's
    ``/upload`` takes any file type, and keeps it an hour)."""

    def __init__(self, app, limits: PublicLimits, max_file_bytes: int, trace_dirs=()):
        self.app, self.limits = app, limits
        self.max_request_bytes = max_file_bytes + 64 * 1024       # one file and its multipart framing
        self.trace_dirs = tuple(trace_dirs)
        self.uploads = RateLimit(limits.uploads_per_minute)
        self.unknown_polls = RateLimit(limits.unknown_polls_per_minute)
        self.trusted = trusted_proxies(limits.trusted_proxies)
        self.streams: dict = defaultdict(int)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        token = CLIENT.set(client_of(scope, self.trusted))
        try:
            path = scope["path"].rstrip("/")
            if scope["method"] == "POST" and path.endswith("/upload"):
                await self._upload(scope, receive, send)
            elif scope["method"] in ("POST", "PUT", "PATCH"):
                await self._bounded_body(scope, receive, send)
            elif _is_stream(path):
                await self._stream(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        except Refused as exc:
            await _reply(send, exc.status, str(exc))
        finally:
            CLIENT.reset(token)

    async def _bounded_body(self, scope, receive, send):
        """Read the whole body (at most ``body_bytes_max``) before the app sees any of it: a
        larger one is refused with 413 without being parsed or kept."""
        cap = self.limits.body_bytes_max
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > cap):
            raise Refused(413, f"a request body may be at most {cap} bytes")
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > cap:
                raise Refused(413, f"a request body may be at most {cap} bytes")
            if not message.get("more_body", False):
                break
        replay = iter(messages)

        async def buffered_receive():
            return next(replay, None) or await receive()

        await self.app(scope, buffered_receive, send)

    async def _stream(self, scope, receive, send):
        client = CLIENT.get()
        if scope["path"].rstrip("/").endswith("/queue/data") and not self._known_session(scope):
            if not self.unknown_polls.allow(client):
                raise Refused(429, "too many polls for unknown sessions from this address: wait a minute")
            raise Refused(404, "unknown session: join the queue first")
        if client is not None and self.streams[client] >= self.limits.streams_per_client:
            raise Refused(429, f"too many open connections from this address (at most "
                               f"{self.limits.streams_per_client})")
        self.streams[client] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.streams[client] -= 1
            if not self.streams[client]:
                del self.streams[client]

    @staticmethod
    def _known_session(scope) -> bool:
        from urllib.parse import parse_qs

        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        session_hash = (query.get("session_hash") or [""])[0]
        try:
            queue = scope["app"].get_blocks()._queue
            return session_hash in queue.pending_messages_per_session
        except Exception:  # noqa: BLE001 — not a Gradio app we know: let it answer
            return True

    async def _upload(self, scope, receive, send):
        headers = dict(scope.get("headers") or ())
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_request_bytes):
            raise Refused(413, f"an upload may be at most {self.max_request_bytes} bytes")
        if not self.uploads.allow(CLIENT.get()):
            raise Refused(429, f"too many uploads from this address (at most {self.limits.uploads_per_minute} a minute)")
        folders = [scope["app"].uploaded_file_dir, *((d, TRACE_PREFIX) for d in self.trace_dirs)]
        if not await asyncio.to_thread(make_room, [f for f in folders if os.path.isdir(f if isinstance(f, str) else f[0])],
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
        holder = install_state_holder(app, blocks, limits)
        own_upload_folder(app, trace_dirs)
        loop = asyncio.get_running_loop()
        reaper = loop.create_task(reap_slow_connections(lambda: getattr(blocks, "server", None), limits))
        releaser = loop.create_task(_release_after_evictions(holder, limits))
        try:
            yield
        finally:
            reaper.cancel()
            releaser.cancel()

    return {"middleware": [Middleware(LimitsMiddleware, limits=limits, max_file_bytes=config.trace_max_bytes,
                                      trace_dirs=trace_dirs)],
            "lifespan": lifespan}


async def _release_after_evictions(holder, limits: PublicLimits) -> None:
    """After sessions were evicted, hand their memory back (``release_memory``, off the loop)."""
    while True:
        await asyncio.sleep(max(limits.reap_every_s, 1.0))
        if not holder.released:
            holder.released = True
            with contextlib.suppress(Exception):
                await asyncio.to_thread(release_memory)
