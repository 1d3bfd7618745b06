"""Paused step-mode runs (each holds a KV cache): ended after an idle time, and the oldest
ends when all of them together would hold more than a memory cap; the visitor then reads why
(``Session.expired``)."""
from __future__ import annotations

import contextlib
import threading
import time
import weakref

from app.ui.limits.bounds import MiB, PublicLimits


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
