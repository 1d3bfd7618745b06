"""`python -m app tune`: measure this machine's profile for the auto tree, once, and keep it.

The profile is the target's forward cost curve T(n) (timed as ratios to T(1), so load
cancels) and the head's acceptance on built-in prompts (``app.engine.autotune``), kept for
the thread count chosen here, with the load it met. ``generate`` and the app read it, at this
or any other thread count (scaled by their thread probe), and never re-measure on their own.
With the default head it calibrates every shipped head, so that ``generate`` can draft with
the one predicted faster here (``app.engine.head_choice``). Run this again after changing the
machine or the head (``--retune`` measures even if a profile is kept: the new one replaces the
kept one unless it met more load, ``autotune.replaces``).
"""
from __future__ import annotations

import argparse
import os
import sys

from app.args import add_model_arguments, thread_governor
from app.engine.drafters.registry import DEFAULT_HEAD_KIND
from app.engine.sources import DEFAULTS


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--retune", action="store_true", help="measure again even if a profile is kept")


def main(args) -> int:
    # lazy: torch and transformers (~20 s on a loaded CPU) only for a run, not for `tune --help`
    from app.engine.autotune import choose_tree, cost_curve_text, under_load
    from app.engine.factory import load_engine
    from app.engine.head_choice import choose_head, shipped_engines
    from app.engine.threads import ThreadGovernor, engine_probe

    try:
        governor = thread_governor(args)
        engine, _ = load_engine(args.base_model, args.draft_model, args.device, args.dtype,
                                full_draft_vocab=args.full_draft_vocab, forward=args.forward)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    say = lambda m: print(f"[tune] {m}", file=sys.stderr, flush=True)  # noqa: E731
    probe = engine_probe(engine)
    governor.apply(probe)                     # the profile is kept per thread count, like generate picks it
    say(f"threads: {governor.text()}")
    # the thread probe is kept with the profile, for the record of how contended the machine
    # was (at 2 threads beside a busy process it costs several times 1 thread's); a fixed count
    # did not probe
    probe_ms = governor.probe_ms()
    if not probe_ms:
        record = ThreadGovernor()             # times every count, restores the fixed one
        record.probe(probe)
        probe_ms = record.probe_ms()
    tree, choice = choose_tree(engine, refresh=args.retune, progress=say, probe_ms=probe_ms, derive=False)
    curve = choice.cost_curve
    print(f"[tune] {engine.target.name} ({str(engine.target.dtype).replace('torch.', '')}) on "
          f"{engine.target.device.type}, load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"[tune] T(n), n query tokens: {cost_curve_text(curve.sizes, curve.ms)}")
    if curve.noise:
        print("[tune] relative spread of T(n)/T(1): "
              + ", ".join(f"{n}: {x:.0%}" for n, x in zip(curve.sizes, curve.noise) if n > 1))
    print(f"[tune] {choice.summary()}")
    kept_load = curve.key.get("load")
    if under_load(kept_load):
        print(f"[tune] note: measured beside other work (load average {kept_load:.2f}), and marked so. Under "
              "contention a forward over several tokens costs relatively more, so this profile favours small "
              "trees; generate adapts its tree while decoding either way. `python -m app tune --retune` on a "
              "quieter machine replaces it (a busier one never does).")
    if args.draft_model in DEFAULTS:          # every shipped head, so that the default can be chosen by measurement
        others = shipped_engines(engine, args.base_model,
                                 lambda folder: load_engine(draft_model=str(folder), target=engine.target)[0])
        for name, other in others.items():
            _, theirs = choose_tree(other, refresh=args.retune, progress=say, probe_ms=probe_ms, derive=False)
            print(f"[tune] {name}: {theirs.summary()}")
        if others:
            print(f"[tune] {choose_head({DEFAULT_HEAD_KIND: engine, **others}, probe_ms).text()}")
    return 0
