"""One thread owns every torch computation of the app server: loading, autotune, every run.

Why not just start a thread per run: on a CPU, PyTorch parallelises each op with OpenMP, and
an OpenMP runtime keeps one *team* of worker threads per calling thread. When the model is
loaded on one thread and decoded on another, the process ends up with two teams. Measured on
the 2-core dev machine (embedded model, 256 tokens, auto tree), with no Gradio involved:
decoding on the thread that loaded the model ran 29.5-30.5 tokens/s, on a fresh thread
22.8-24.0; loading *and* decoding on one worker thread, the main thread never touching torch,
ran as fast as the main thread. Once a second thread had run torch even the first got slower:
the idle team's spinning workers compete with the busy team for the same two cores.

So the server hands every piece of model work to one long-lived thread, the *engine thread*,
as a job, and jobs run one after another. That also serialises the visitors' runs on the
shared model, which a lock used to do.

A process forked from the server (ZeroGPU runs handlers that way) does not inherit threads,
so the engine thread is started again in a process that does not have it yet.
"""
from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")


class EngineThread:
    """A single worker thread, per process, that runs submitted jobs in order.

    ``submit(fn, ...)`` queues a job and returns a ``Future``; ``call(fn, ...)`` waits for its
    result (and runs ``fn`` directly when already on the engine thread, so a job may call it
    without deadlocking). ``idle`` says whether no job is queued or running.
    """

    def __init__(self, name: str = "eagle-lens-engine"):
        self._name = name
        self._guard = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._ident: int | None = None     # the worker's thread id, once it has run a job
        self._pending = 0                  # jobs queued or running
        # In a forked child only the forking thread exists: forget the pool whose worker is gone
        # and start a new one on first use (a fresh guard too, in case another thread held it
        # at the moment of the fork).
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: ref() is not None and ref()._forget())

    def _forget(self) -> None:
        self._guard = threading.Lock()
        self._pool, self._ident, self._pending = None, None, 0

    def _executor(self) -> ThreadPoolExecutor:
        # ThreadPoolExecutor with one worker keeps that worker for its whole life: every job
        # runs on the same OS thread, which is the point.
        if self._pool is None:             # first use, or a forked child (see _forget)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        return self._pool

    def _run(self, fn: Callable[..., T], args, kwargs) -> T:
        self._ident = threading.get_ident()
        try:
            return fn(*args, **kwargs)
        finally:
            with self._guard:
                self._pending -= 1

    def submit(self, fn: Callable[..., T], *args, **kwargs) -> Future:
        """Queue ``fn(*args, **kwargs)`` on the engine thread."""
        with self._guard:
            pool = self._executor()
            self._pending += 1
        try:
            return pool.submit(self._run, fn, args, kwargs)
        except BaseException:
            with self._guard:
                self._pending -= 1
            raise

    def on_engine_thread(self) -> bool:
        return self._ident == threading.get_ident()

    def call(self, fn: Callable[..., T], *args, timeout: float | None = None, **kwargs) -> T:
        """``fn(*args, **kwargs)`` run on the engine thread; its result (or its exception)."""
        if self.on_engine_thread():
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result(timeout)

    @property
    def idle(self) -> bool:
        """No job queued or running (the model is free)."""
        return self._pending == 0

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every job queued so far has finished; False if ``timeout`` passed first."""
        try:
            self.call(lambda: None, timeout=timeout)
        except TimeoutError:
            return False
        return True
