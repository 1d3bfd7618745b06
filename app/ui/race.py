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


def interleave(eagle: Iterator, vanilla: Iterator | None, chunk_tokens: int = 16) -> Iterator[tuple[str, object]]:
    """(side, record) from the two runs' record streams, alternating in chunks: the EAGLE run
    advances until it has ``chunk_tokens`` more tokens, then the vanilla run until it has as
    many tokens as the EAGLE run, ... Each stream is consumed to its end (its summary).
    ``vanilla`` None: the EAGLE run alone. Closing this generator closes both runs."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    n_eagle = n_vanilla = 0
    eagle_done, vanilla_done = False, vanilla is None
    goal = chunk_tokens
    try:
        while not eagle_done:
            while not eagle_done and n_eagle < goal:
                event = next(eagle, None)
                if event is None:
                    eagle_done = True
                    break
                n_eagle += _tokens(event)
                yield EAGLE, event
                if getattr(event, "type", None) == "summary":
                    eagle_done = True
            while not vanilla_done and (n_vanilla < n_eagle or eagle_done):
                event = next(vanilla, None)
                if event is None:
                    vanilla_done = True
                    break
                n_vanilla += _tokens(event)
                yield VANILLA, event
                if getattr(event, "type", None) == "summary":
                    vanilla_done = True
            goal = n_eagle + chunk_tokens
    finally:
        for stream in (eagle, vanilla):
            if stream is not None and hasattr(stream, "close"):
                stream.close()
