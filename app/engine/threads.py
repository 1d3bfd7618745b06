"""How many CPU threads a forward should use *now*: measured, because a busy neighbour can
make more threads slower.

torch runs a CPU forward as OpenMP parallel regions over every core it was given, and each
region ends at a barrier: all threads wait for the slowest. When another process holds a
core, one of our threads is descheduled at every barrier and the whole forward waits for it.
Measured on a 2-core machine with other processes running (load 2.4-3.2, the embedded
SmolLM2-135M, 48 tokens, OpenMP threads spinning at barriers): vanilla decoding ran at 14-16
tokens/s with 1 thread and 1.9-7.5 with 2; a 2-node chain at 7.8-9.2 with 1 thread and
0.6-1.8 with 2. Letting waiting threads sleep (``OMP_WAIT_POLICY=PASSIVE``, set in
``app/__init__.py``) removes most of that collapse, but which count is faster still
depends on the neighbours. On a quiet machine 2 threads are faster. So the thread count is chosen by timing, just before a run, and the
same choice serves every method of a comparison (a race, a benchmark row), so that no
method gets an advantage the other does not.
"""
from __future__ import annotations

import os
import statistics
import time

import torch

# a choice is reused for this long (seconds): a race's EAGLE and vanilla runs share one
REUSE_S = 20.0
# an option this many times slower than the best in a round is dropped from the probe
ABANDON = 3.0


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
        return self.choice

    def apply(self, forward) -> int:
        """Set the thread count for the next run (probing if the last probe is stale)."""
        if self.fixed is None and (self.choice is None or time.monotonic() - self._when > REUSE_S):
            self.probe(forward)
        torch.set_num_threads(self.choice)
        return self.choice

    def text(self) -> str:
        if self.fixed is not None:
            return f"{self.fixed} thread(s), fixed"
        parts = ", ".join(f"{n}: {statistics.median(t):.0f} ms" for n, t in self.times.items() if t)
        return f"{self.choice} thread(s) (probe, ms per probe forward by thread count: {parts})"


def engine_probe(engine, prefix_len: int = 64, tree_tokens: int = 4):
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
