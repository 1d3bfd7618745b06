"""Run an engine generation on the engine thread so that the page never makes it wait.

The engine yields one record per target forward. If the Gradio handler pulled those records
itself, every page update (building figures, serialising JSON, sending it) would pause the
engine. Instead a ``BackgroundRun`` job on the server's single engine thread
(``engine_thread.EngineThread``: every torch op of the server runs there) pulls them as fast
as the engine makes them and puts them on a queue; the handler wakes up every ``interval``
seconds, takes whatever arrived, and draws once. Torch releases Python's GIL inside its
kernels, so drawing and decoding overlap.

Stopping: ``close()`` sets a flag that the thread checks after every record; the thread then
closes the engine's iterator, so generation ends within one step. ``close()`` does not wait
for that (Gradio may call it on its event loop, which must never block); the engine thread
runs one job at a time, so the next run — whoever's it is — starts only once this one has let
go of the model.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterator

from app.ui.engine_thread import EngineThread

_DONE = object()


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


class BackgroundRun:
    def __init__(self, events: Iterator, engine_thread: EngineThread):
        self._events = events
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._ended = threading.Event()   # set after the last item is queued
        self._job = engine_thread.submit(self._pump)   # queued behind any run still finishing

    def _pump(self) -> None:
        try:
            if not self._stop.is_set():   # closed while queued: never start the engine
                for record in self._events:
                    self._queue.put(record)
                    if self._stop.is_set():
                        break
        except BaseException as exc:      # handed to the handler thread, which re-raises it
            self._queue.put(_Failed(exc))
        finally:
            self._events.close()          # only the engine thread ever touches the engine's iterator
            self._queue.put(_DONE)
            self._ended.set()

    def batches(self, interval: float) -> Iterator[list]:
        """Lists of new records: one list every ``interval`` seconds — empty when no record
        arrived, so that the caller can still notice a Stop while the engine is silent (a long
        prefill, or this run queued behind another visitor's) — and a last (possibly empty)
        one when the run has ended. With ``interval`` 0, a list per arriving record. Re-raises
        an error from the engine."""
        done = False
        while not done:
            if interval > 0:
                # Sleep through the interval instead of waking for every record: each wake-up
                # of this thread would preempt one of the engine's OpenMP threads on a small
                # CPU (~30 records/s on 2 cores). Wake early only when the run has ended.
                self._ended.wait(timeout=interval)
                items = []
                while True:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
            else:                         # interval 0 (tests): a list for each record, however fast
                items = [self._queue.get()]   # they come, so a run's views never depend on timing
            batch: list = []
            for item in items:
                if item is _DONE:
                    done = True
                    break
                if isinstance(item, _Failed):
                    raise item.exc
                batch.append(item)
            if batch or done or interval > 0:
                yield batch

    def close(self) -> None:
        """Ask the run to stop after the current step (returns at once)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the run has ended (its job on the engine thread has returned)."""
        self._ended.wait(timeout)
