"""How many CPU threads a forward should use *now*: measured, because a busy neighbour can
make more threads slower; and a run that falls back to one thread when a neighbour arrives.

torch and the fast forward's kernels run a CPU forward as OpenMP parallel regions over every
thread they were given (~150 regions a step for SmolLM2's 30 layers), and each region ends
at a barrier: all threads wait for the slowest. How a thread waits decides what a second
core is worth. Measured on the 2-core dev machine (embedded SmolLM2-135M, bfloat16, two
prompts x 96 tokens, tokens/s; benchmarks/fast-forward/threads-wait-policy.md):

    waiting thread                     quiet, 1 / 2 threads     one busy process beside, 1 / 2
    sleeps (OMP_WAIT_POLICY=PASSIVE)   82 / 61                  90 / 80
    spins ~3 ms (libgomp's default)    89 / 137                 89 / 43

A sleeping thread must be woken for every region, which costs more than the second core
gives; a spinning one keeps pace, but beside a busy process it burns the core its partner
needs and every barrier waits for a descheduled thread. So the app keeps libgomp's default
(it sets no wait policy), and the thread count is chosen by timing just before a run
(``ThreadGovernor``); the same choice serves every method of a comparison (a race, a
benchmark row), so that no method gets an advantage the other does not. A neighbour that
arrives mid-run is caught by ``ThreadGovernor.guard``: steps several times slower than the
run's own put the rest of the run on one thread. Output never depends on the thread count
(the fast forward's rows have the same bits on any number of threads).
"""
from __future__ import annotations

import os
import statistics
import time
from collections import deque
from typing import Iterable, Iterator

import torch

# a choice is reused for this long (seconds): a race's EAGLE and vanilla runs share one
REUSE_S = 20.0
# an option this many times slower than the best in a round is dropped from the probe
ABANDON = 3.0
# guard: a step this many times slower than the median of the run's earlier steps is slow;
# SLOW_STEPS slow steps in a row (after SETTLE judged ones) put the run on one thread. A
# step's own cost varies less than 2x (tree size, draft depth); a neighbour's arrival costs
# 3-30x with spinning threads (the table above).
SLOWDOWN = 2.5
SLOW_STEPS = 2
SETTLE = 4


def wait_policy() -> str:
    """How OpenMP's waiting threads wait in this process, as the environment told libgomp at
    start ("default": spin ~3 ms, then sleep). Part of the key of a kept multi-thread timing:
    sleeping threads give another cost curve than spinning ones."""
    spin = os.environ.get("GOMP_SPINCOUNT", "").strip()
    policy = os.environ.get("OMP_WAIT_POLICY", "").strip().lower()
    return f"spin {spin}" if spin else (policy or "default")


def thread_options(cores: int | None = None) -> list[int]:
    """1 and every core (and half of them on machines with more than 4)."""
    cores = cores or os.cpu_count() or 1
    return sorted({1, max(1, cores // 2), cores}) if cores > 4 else sorted({1, cores})


def fastest(times: dict[int, list[float]], margin: float = 1.05) -> int:
    """The thread count with the lowest median time; more threads only when they beat fewer
    by ``margin`` (a tie goes to fewer threads: less exposed to the next neighbour)."""
    best = None
    for n in sorted(times):
        if not times[n]:
            continue
        med = statistics.median(times[n])
        if best is None or med * margin < best[1]:
            best = (n, med)
    return best[0] if best else 1


class ThreadGovernor:
    """Sets ``torch.set_num_threads`` to the count that runs the target's forward fastest now.

    ``probe(forward)`` times ``forward()`` (one decode-sized and one tree-sized forward) under
    each option, interleaved over ``rounds`` so that a burst of load hits all options alike.
    About 2 x rounds x options forwards: a fraction of a second for a small model. ``apply``
    probes at most every ``REUSE_S`` seconds; ``fixed`` pins a count (no probing)."""

    def __init__(self, options: list[int] | None = None, rounds: int = 2, fixed: int | None = None):
        self.options = options or thread_options()
        self.rounds = rounds
        self.fixed = fixed
        self.choice: int | None = fixed
        self.times: dict[int, list[float]] = {}
        self._when = 0.0
        self.fell_back = ""               # why the last run fell back to one thread ("" = it did not)

    def probe(self, forward) -> int:
        times: dict[int, list[float]] = {n: [] for n in self.options}
        before = torch.get_num_threads()
        live = list(self.options)
        try:
            for r in range(self.rounds + 1):          # round 0 warms up
                for n in list(live):
                    torch.set_num_threads(n)
                    t0 = time.perf_counter()
                    forward()
                    ms = (time.perf_counter() - t0) * 1e3
                    times[n].append(ms)
                # an option several times slower than the best is not timed again
                best = min(min(t) for t in times.values() if t)
                live = [n for n in live if min(times[n]) <= ABANDON * best]
        finally:
            torch.set_num_threads(before)
        times = {n: t[1:] or t for n, t in times.items()}     # drop the warm-up forward
        self.times, self.choice, self._when = times, fastest(times), time.monotonic()
        self.fell_back = ""
        return self.choice

    def apply(self, forward) -> int:
        """Set the thread count for the next run (probing if the last probe is stale)."""
        if self.fixed is None and (self.choice is None or time.monotonic() - self._when > REUSE_S):
            self.probe(forward)
        torch.set_num_threads(self.choice)
        return self.choice

    def guard(self, events: Iterable) -> Iterator:
        """``events`` (a run's ``Engine.generate``) passed through unchanged, watched: while
        more than one thread is in use, ``SLOW_STEPS`` steps in a row each ``SLOWDOWN`` times
        the median of the run's earlier steps mean a neighbour took a core, so the rest of the
        run goes on one thread and the next ``apply`` probes afresh. A fixed count is kept."""
        usual: deque[float] = deque(maxlen=16)   # the last step times (ms) that were not slow
        slow = 0
        try:
            for event in events:
                ms = getattr(event, "step_ms", None)
                if (self.fixed is None and ms is not None and getattr(event, "type", "") == "step"
                        and not event.prefill and torch.get_num_threads() > 1):
                    median = statistics.median(usual) if len(usual) >= SETTLE else None
                    if median is not None and ms > SLOWDOWN * median:
                        slow += 1
                        if slow >= SLOW_STEPS:
                            self.fall_back(f"steps slowed from {median:.0f} to {ms:.0f} ms")
                    else:
                        slow = 0
                        usual.append(ms)
                yield event
        finally:
            close = getattr(events, "close", None)
            if close is not None:         # closing the guard stops the run, as closing the run would
                close()

    def fall_back(self, why: str) -> None:
        """One thread from now on, until the next probe (which the next ``apply`` runs)."""
        torch.set_num_threads(1)
        self.choice, self._when = 1, 0.0
        self.fell_back = why

    def probe_ms(self) -> dict[int, float]:
        """The last probe as {threads: median ms per probe forward} ({} before any, or fixed):
        kept with a measured profile (how contended the machine was) and used to scale another
        thread count's kept profile to this one (``autotune.thread_scale``)."""
        return {n: statistics.median(t) for n, t in self.times.items() if t}

    def text(self) -> str:
        if self.fixed is not None:
            return f"{self.fixed} thread(s), fixed"
        if self.fell_back:
            return f"1 thread (fell back from more mid-run: {self.fell_back})"
        parts = ", ".join(f"{n}: {statistics.median(t):.0f} ms" for n, t in self.times.items() if t)
        return f"{self.choice} thread(s) (probe, ms per probe forward by thread count: {parts})"


# the probe forward's tree-sized query (tokens): ``autotune.thread_scale`` prices the probe on a
# kept cost curve as T(1) + T(PROBE_TREE_TOKENS)
PROBE_TREE_TOKENS = 4


def engine_probe(engine, prefix_len: int = 64, tree_tokens: int = PROBE_TREE_TOKENS):
    """A ``forward()`` for ``ThreadGovernor.probe``: the engine's own decode forward over 1
    token and over ``tree_tokens`` tokens on a short cached prefix, plus the LM head."""
    # lazy: kv imports transformers (+3 s measured); the ThreadGovernor above is read before
    # any model loads (app.args' --threads check, `bench --help`), with torch alone
    from app.engine import kv

    target = engine.target
    model, device = target.model, target.device
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prefix = torch.randint(0, vocab, (1, prefix_len), generator=g).to(device)
    cache = kv.preallocated_cache(model, prefix_len + tree_tokens)
    with torch.inference_mode():
        engine.decoder.prefill(prefix, cache)
    shapes = []
    for n in (1, tree_tokens):
        ids = torch.randint(0, vocab, (1, n), generator=g).to(device)
        pos = torch.arange(prefix_len, prefix_len + n, device=device)[None]
        mask = (torch.ones(n, prefix_len + n, dtype=torch.bool, device=device).tril(prefix_len)[None, None]
                if n > 1 else None)
        shapes.append((ids, pos, mask))

    @torch.inference_mode()
    def forward():
        for ids, pos, mask in shapes:
            hidden = engine.decoder(ids, pos, mask, cache)
            engine.decoder.logits(hidden[0])
            kv.crop(cache, prefix_len)
    return forward
