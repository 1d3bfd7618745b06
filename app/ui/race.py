"""The race against plain decoding, run fairly on a shared machine.

A speedup is a ratio of two timings. Taken minutes apart on a machine whose neighbours come
and go, the two timings measure different machines (a vanilla timing reused from an earlier
run had drifted from 260 to 507 ms a step). So the EAGLE run and a fresh vanilla run of the
same request are *interleaved*: EAGLE decodes about ``chunk_tokens`` tokens, then vanilla
catches up to the same number of tokens, and so on, on the same engine thread. Load that
comes or goes slows both alike, and each chunk gives its own ratio (the spread the page
shows beside the speedup). Both runs use the thread count chosen for this request.
"""
from __future__ import annotations

from typing import Iterator

EAGLE, VANILLA = "eagle", "vanilla"


def _tokens(event) -> int:
    return len(event.new_tokens) if getattr(event, "type", None) == "step" else 0


class _Stream:
    """One run's records, consumed a stretch at a time, counting its tokens."""

    def __init__(self, side: str, events: Iterator | None):
        self.side, self.events, self.tokens, self.done = side, events, 0, events is None

    def advance(self, enough) -> Iterator[tuple[str, object]]:
        """(side, record) until ``enough(self)`` or the run's end (its summary)."""
        while not self.done and not enough(self):
            event = next(self.events, None)
            if event is None:
                self.done = True
                return
            self.tokens += _tokens(event)
            yield self.side, event
            if getattr(event, "type", None) == "summary":
                self.done = True


def interleave(eagle: Iterator, vanilla: Iterator | None, chunk_tokens: int = 16) -> Iterator[tuple[str, object]]:
    """(side, record) from the two runs' record streams, alternating in chunks: the EAGLE run
    advances until it has ``chunk_tokens`` more tokens, then the vanilla run until it has as
    many tokens as the EAGLE run, ... Each stream is consumed to its end (its summary).
    ``vanilla`` None: the EAGLE run alone. Closing this generator closes both runs."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    e, v = _Stream(EAGLE, eagle), _Stream(VANILLA, vanilla)
    goal = chunk_tokens
    try:
        while not e.done:
            yield from e.advance(lambda s: s.tokens >= goal)
            yield from v.advance(lambda s: s.tokens >= e.tokens and not e.done)   # catch up; all of it at the end
            goal = e.tokens + chunk_tokens
    finally:
        for stream in (eagle, vanilla):
            if stream is not None and hasattr(stream, "close"):
                stream.close()


def round_robin(runs: dict[str, Iterator], chunk_tokens: int = 16) -> Iterator[tuple[str, object]]:
    """(name, record) from several runs' record streams, taking turns: each run in order
    advances until it has ``chunk_tokens`` more tokens than at its last turn (or ends), then
    the next. The methods of the page's comparison share the machine this way, so a burst of
    load falls on all of them within one round. Each stream is consumed to its end (its
    summary); closing this generator closes every run."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    streams = [_Stream(name, events) for name, events in runs.items()]
    try:
        goal = chunk_tokens
        while not all(s.done for s in streams):
            for s in streams:
                yield from s.advance(lambda t: t.tokens >= goal)
            goal += chunk_tokens
    finally:
        for events in runs.values():
            if hasattr(events, "close"):
                events.close()

