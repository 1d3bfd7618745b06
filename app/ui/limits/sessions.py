"""The memory budget of the visitors' sessions: Gradio's session store with a byte budget
besides the count (``BoundedStateHolder``), a cap on sessions per client, a rate limit on each
client's new sessions, and eviction of *idle* sessions only (least recently used first): when
every session is active a new one is refused, none is displaced (and a client over its own cap
can displace only its own idle sessions). A session unused for its state's time to live ends
(sooner once its tab closed), and the memory it held goes back to the system. ``session_bytes``
estimates what a session holds."""
from __future__ import annotations

import contextlib
import time

from app.ui.limits.bounds import MiB, PublicLimits
from app.ui.limits.clients import CLIENT, RateLimit, Refused
from app.ui.session import Session


def session_bytes(session) -> int:
    """An estimate of the memory a visitor's ``Session`` holds in step records: per step ~600
    bytes, per draft-tree node ~450 (nine Python lists of boxed numbers and a short text), and
    the texts. A shipped demo's records are shared by every session showing it (parsed once)
    and count nothing. Cached per step count, so it costs nothing between runs."""
    if not isinstance(session, Session):
        return 0
    runs = [session.steps] + ([session.race_vanilla.steps] if session.race_vanilla is not None else [])
    key = tuple(len(r) for r in runs) + (id(session.steps), session.records_shared)
    if session._bytes_key != key:
        session._bytes_key, session._bytes = key, 0 if session.records_shared else sum(map(records_bytes, runs))
    return session._bytes


def records_bytes(steps) -> int:
    """``session_bytes``' estimate for one run's step records."""
    return sum(step_bytes(len(s.text), len(s.tree) if s.tree else 0, sum(map(len, s.tree.texts)) if s.tree else 0)
               for s in steps)


def step_bytes(text_chars: int, nodes: int, node_chars: int) -> int:
    """The estimate for one step record: its text's characters, its tree's nodes and their
    texts' characters (``traces.estimate_bytes`` counts these in a trace before parsing it)."""
    return 600 + text_chars + 450 * nodes + node_chars


def _sessions_in(state) -> list:
    return [v for v in getattr(state, "state_data", {}).values() if isinstance(v, Session)]


def _state_holder_class():
    # lazy: app.ui.limits, and the handlers that import it, load without gradio (~16 s here);
    # only the page's launch installs this class
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
            self.expired = 0
            self.ttl_s = None
            self.released = True
            self.releases = 0
            self._bytes_checked = 0.0
            if old is not None:       # keep what the server already holds
                self.session_data, self.time_last_used = old.session_data, old.time_last_used

        def set_blocks(self, blocks):
            super().set_blocks(blocks)
            self.capacity = self.limits.sessions_max
            from gradio.components import State

            self.ttl_s = min((b.time_to_live for b in blocks.blocks.values()
                              if isinstance(b, State) and b.time_to_live), default=None)

        def delete_all_expired_state(self):
            """Gradio's expiry (its own task calls this every second), then ours: a session
            unused for ``ttl_s`` (the visitor's ``gr.State``'s time to live), or for
            ``limits.idle_s`` once its page closed, ends like an evicted one. Gradio counts a
            State's time to live from when an event last *returned* it, and the page's
            ``Session`` is only ever changed in place, so Gradio alone never ended a session:
            its records stayed until the server was full."""
            super().delete_all_expired_state()
            if self.ttl_s is None:
                return
            import datetime

            now = datetime.datetime.now()
            with self.lock:
                for sid, state in list(self.session_data.items()):
                    ttl = min(self.ttl_s, self.limits.idle_s) if getattr(state, "is_closed", False) else self.ttl_s
                    if sid in self.time_last_used and self._idle(sid, now, ttl):
                        self._evict(sid, expired=True)

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

        def _idle(self, sid: str, now, idle_s: float | None = None) -> bool:
            """Session ``sid`` runs no handler and was last used over ``idle_s`` seconds ago
            (default ``limits.idle_s``)."""
            last = self.time_last_used.get(sid)
            busy = any(s.busy for s in _sessions_in(self.session_data.get(sid)))
            idle_s = self.limits.idle_s if idle_s is None else idle_s
            return not busy and (last is None or (now - last).total_seconds() > idle_s)

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

        def _evict(self, sid: str, expired: bool = False) -> None:
            """Drop a session (its delete callbacks run: a paused run is closed); counted as
            ``expired`` or ``evicted``. Lock held."""
            if expired:
                self.expired += 1
            else:
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
