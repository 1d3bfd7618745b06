"""Which kept profile serves a start, and which measurement is kept: the rules alone.

A profile (a cost curve T(n) and a calibration, ``autotune``) is measured per thread count
and per load; these pure functions decide, from the records' keys, whether one measured
beside other work may be replaced and how a curve of one thread count is put on another's
scale. ``autotune`` applies them to the files it keeps; tests call them directly.
"""
from __future__ import annotations

from app.engine.cost import MEASURED_FIELDS, CostCurve
from app.engine.threads import PROBE_TREE_TOKENS


# --- a kept profile: which one serves, and which one is kept ---------------------------------
#
# A profile (cost curve + calibration) is kept per thread count, like the key says, but one
# measured at any thread count serves every other: ``choose_from`` is invariant to the scale
# of the curve (every candidate's time is a multiple of it: the calibration is put on the
# curve's scale through its vanilla step), so the tree it picks from a 2-thread curve is the
# one it picks from that curve scaled to 1 thread; only the absolute ms it reports change,
# and those are put on this start's scale by its thread probe (``thread_scale``). The adaptive run measures the
# real step times anyway. So a start never measures in the foreground while any profile of
# this machine exists; it measures only when none does (a first start).
#
# A measurement records the load it met (the 1-minute load average when it began, and the
# thread probe then). A profile measured at a load of ``BUSY_LOAD`` or more is marked busy
# (``under_load``) and is replaced by a later measurement of the same key at a lower load
# (``python -m app tune --retune``); a measurement at a higher load never replaces a quiet one
# (``replaces``).

# the load average from which a measurement counts as taken beside other work: another process
# took about a core
BUSY_LOAD = 1.0
# what a thread count's profile depends on beside what every other key holds
THREAD_FIELDS = ("threads", "omp_wait")


def under_load(load: float | None) -> bool:
    """Whether a measurement that began at this load average was taken beside other work."""
    return load is not None and load >= BUSY_LOAD


def replaces(new_load: float | None, kept_load: float | None) -> bool:
    """Whether a measurement at ``new_load`` replaces the kept one of the same key, measured at
    ``kept_load``: a quiet one replaces a quiet one (it is newer) or a busy one; a busy one
    replaces only a busier one. Without a reading (an OS without load averages, an old record)
    the newer one is kept unless only the kept one has a reading."""
    if kept_load is None:
        return True
    if new_load is None:
        return False
    if not under_load(kept_load):
        return not under_load(new_load)
    return new_load < kept_load


def _thread_free(key: dict) -> dict:
    return {k: v for k, v in key.items() if k not in MEASURED_FIELDS and k not in THREAD_FIELDS}


def _probe(record: dict | None) -> dict[int, float]:
    """A thread probe as {threads: ms} (JSON keeps the counts as strings)."""
    try:
        return {int(n): float(ms) for n, ms in (record or {}).items() if ms}
    except (TypeError, ValueError):
        return {}


def thread_scale(curve: CostCurve, threads: int, probe_now: dict | None) -> float:
    """What puts ``curve`` (measured at another thread count) on the scale of a forward at
    ``threads`` now: this start's thread probe at ``threads`` over the curve's own price of
    the probe's work. The probe (``threads.engine_probe``) runs the verify forward over 1 and
    ``PROBE_TREE_TOKENS`` tokens, so that price is T(1) + T(PROBE_TREE_TOKENS) (on a longer
    prefix: the scale errs a little low). Without a probe at ``threads`` (a fixed count): 1.
    Only the reported ms depend on it; the pick does not (see above)."""
    now = _probe(probe_now).get(threads)
    price = curve(1) + curve(PROBE_TREE_TOKENS)
    return now / price if now and price > 0 else 1.0


def _preference(key: dict, load: float | None, threads: int):
    """Sort key among other thread counts' profiles: quiet before busy, then the nearest
    thread count, then the lower load."""
    n = key.get("threads") or 0
    return under_load(load), abs(n - threads), float("inf") if load is None else load
