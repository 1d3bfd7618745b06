"""One visitor's state. It lives in a ``gr.State`` (per browser session), never in a module
global, so visitors cannot see each other's runs. The server's session store
(``limits.BoundedStateHolder``) drops it after ``ServerConfig.session_ttl_s`` idle seconds, or
``PublicLimits.idle_s`` once its tab closed; ``close`` then ends a paused step-mode run."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from app.engine.events import RunSummary, StepEvent


@dataclass
class VanillaRun:
    """The vanilla side of the race: a fresh run for every request."""

    key: tuple
    steps: list[StepEvent]
    summary: RunSummary


@dataclass(frozen=True)
class PinnedRun:
    """A run the visitor pinned as "A", to compare the next run ("B") with: its settings, step
    records, summary and the tokens/s of the vanilla run raced against it (if any)."""

    run_id: int
    label: str
    settings: dict
    steps: tuple
    summary: RunSummary
    vanilla_tokens_per_s: float | None
    race: object | None = None     # its speedup over its own vanilla (``app.viz.race.RaceSpeedup``), if raced


@dataclass
class Session:
    settings: dict = field(default_factory=dict)     # the settings of the run on screen
    prompt_ids: tuple = ()                            # its prompt as the engine read it (a live run's)
    model: dict = field(default_factory=dict)        # target / head / device / dtype of that run
    steps: list[StepEvent] = field(default_factory=list)
    summary: RunSummary | None = None
    race_vanilla: VanillaRun | None = None            # the vanilla run raced against this run (never reused)
    race_requested: bool = True                       # the visitor asked for the race
    load: list | None = None                          # load average at the start and end of the run
    threads: str = ""                                 # the CPU threads it ran on ("2 threads"; "" unknown)
    parting: dict | None = None                       # where greedy EAGLE and vanilla parted: the target's top-2 there
    source: str = ""                                  # "live" or "trace: NAME"
    stepper: Iterator | None = None                   # step mode: the paused generation
    stepper_request: object | None = None             # its validated Request, for the race at the end
    trace_path: str | None = None                     # the last trace written for download
    app_seconds: float | None = None                  # wall time of the EAGLE phase through the handler
    run_id: int = 0                                   # counts the runs put on screen (live or from a trace)
    pinned: PinnedRun | None = None                   # A of the A/B comparison: at most one run is kept
    adapter: object | None = None                     # the adaptive run's TreeAdapter (its switches say why)
    # Stop. Plain flags, not threading primitives: gr.State deep-copies its initial value.
    busy: bool = False                                # a Generate / Step / Explore handler is running
    stop_requested: bool = False                      # Stop was pressed; that handler ends at its next update
    stops: int = 0                                    # Stop presses so far
    stops_seen: int = 0                               # ... when the latest engine event was submitted (``submitted``)
    expired: str = ""                                 # why the server ended this visitor's paused run (limits.PausedRuns)
    records_shared: bool = False                      # the records are a shipped demo's, shared by every session
    _bytes_key: tuple = ()                            # limits.session_bytes' cache: its estimate of the records held
    _bytes: int = 0

    def start(self, settings: dict, model: dict, source: str = "live", prompt_ids: tuple = ()) -> None:
        """Forget the run on screen and start a new one (``prompt_ids``: a live run's encoded prompt)."""
        self.close()
        self.settings, self.model, self.source = dict(settings), dict(model), source
        self.prompt_ids = tuple(prompt_ids)
        self.steps, self.summary, self.race_vanilla, self.app_seconds = [], None, None, None
        self.load, self.parting, self.adapter, self.expired = None, None, None, ""
        self.threads = ""
        self.records_shared = False
        self.run_id += 1

    @contextmanager
    def kept_on_error(self):
        """Put back what the session showed if the block fails (a trace that cannot be shown
        must not leave the visitor's page half-replaced); the paused run, if any, is kept."""
        before = dict(self.__dict__)
        stepper = self.stepper
        try:
            yield
        except BaseException:
            self.__dict__.update(before)
            if stepper is not None and before.get("stepper") is stepper and getattr(stepper, "gi_frame", 1) is None:
                self.stepper, self.stepper_request = None, None     # it was closed meanwhile: nothing to resume
            raise

    def submitted(self) -> None:
        """An engine event of this visitor was submitted (its validator runs at the click): a
        Stop pressed after this and before the event starts ends it as it starts."""
        self.stops_seen = self.stops

    def request_stop(self) -> None:
        """Stop: the running handler ends at its next update, and one still waiting in the
        queue ends as it starts."""
        self.stops += 1
        self.stop_requested = True

    @property
    def stopped_while_queued(self) -> bool:
        """Stop was pressed after the latest engine event was submitted and before it started."""
        return self.stops > self.stops_seen

    @contextmanager
    def running(self):
        """Mark a handler as running for this visitor; Stop waits for it to end (``wait_idle``).
        It starts stopped if Stop was pressed while it waited in the queue."""
        self.busy, self.stop_requested = True, self.stopped_while_queued
        try:
            yield
        finally:
            self.busy = False

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no handler of this visitor runs (or ``timeout_s`` passes). Stop calls it so
        that its own message is the last one on the page: a generator still running could
        otherwise overwrite "stopped" with one more "decoding…" update."""
        deadline = time.monotonic() + timeout_s
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.busy

    def close(self) -> None:
        """End a paused step-mode generation (frees its KV cache)."""
        if self.stepper is not None:
            try:
                self.stepper.close()
            except ValueError:
                pass  # a Step is running right now; the dropped iterator is closed when it finishes
        self.stepper, self.stepper_request = None, None


def close_session(session) -> None:
    """``gr.State`` delete callback: the tab closed or the state expired."""
    if isinstance(session, Session):
        session.close()
