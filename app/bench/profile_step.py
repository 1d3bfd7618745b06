"""Where one decoding step's time goes: ``python -m app.bench.profile_step``.

    python -m app.bench.profile_step --draft-model /tmp/randhead --trees 60/5/10,24/5/8,8/3/4
    python -m app.bench.profile_step --forward-costs --dtype bfloat16

Instruments a real ``Engine`` by wrapping (never editing) the verbs one step is made of
(``Engine.draft / verify / accept / commit / record_tree``) and the model calls inside them,
and times each with ``perf_counter`` (CUDA synchronised):

    draft: head forwards        the head's forwards, one per level           (engine.head)
    draft: LM head              the draft's LM head on predicted features    (engine.draft_model.logits)
    draft: tree policy + top-k  the rest of drafting: q's top-k, tree bookkeeping, draft masks
    verify: target forward      the decoder stack over [root, nodes]         (engine.decoder)
    verify: LM head + mask      the rest of verify: tree mask, logits of the visited rows
    accept                      greedy / sequential / chain verification (and softmax of p)
    commit                      KV commit of the accepted path, detokenising
    record                      the step record's tree (texts, p of each node)
    other                       the rest of the step

A random head is fine here (and labelled so): dynamic trees have the same shape whatever the
head accepts, and a step costs the same. ``--forward-costs`` prints T(n), the target's
forward cost over n tokens (app.engine.autotune.measure_forward_costs).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections import defaultdict

import torch

from app.engine.autotune import measure_forward_costs
from app.engine.config import SamplingConfig, TreeConfig, TreeShape
from app.engine.factory import load_engine
from app.engine.loading import load_target

PARTS = ("draft: head forwards", "draft: LM head", "draft: tree policy + top-k", "verify: target forward",
         "verify: LM head + mask", "accept", "commit", "record", "other")
# verb -> the parts measured inside it; the verb's remainder is charged to the last name
_VERBS = {"draft": ("draft: head forwards", "draft: LM head", "draft: tree policy + top-k"),
          "verify": ("verify: target forward", "verify: LM head + mask"),
          "accept": ("accept",), "commit": ("commit",), "record_tree": ("record",)}


class _TimedCall:
    """A callable model part with its call timed and its other methods as they are: the
    engine's decoder (prefill, logits) or the head's forward (an EAGLE-3 head's own
    ``logits``, timed apart as the draft's LM head)."""

    def __init__(self, part, timed_call):
        self._part, self._call = part, timed_call

    def __call__(self, *a, **kw):
        return self._call(*a, **kw)

    def __getattr__(self, name):
        return getattr(self._part, name)


class StepProfiler:
    """Wraps an engine's verbs and model calls with timers; ``totals`` accumulates ms per part.

    The wrappers are instance attributes, removed again on exit: the class stays untouched."""

    def __init__(self, engine):
        self.engine = engine
        self.totals: dict[str, float] = defaultdict(float)
        self.sync = torch.cuda.synchronize if engine.target.device.type == "cuda" else (lambda: None)

    def _timed(self, fn, name):
        def wrapper(*a, **kw):
            self.sync()
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            self.sync()
            self.totals[name] += (time.perf_counter() - t0) * 1e3
            return out
        return wrapper

    def _verb(self, fn, parts):
        """Time a whole verb; what its inner parts did not account for goes to ``parts[-1]``."""
        def wrapper(*a, **kw):
            inner = parts[:-1]
            before = sum(self.totals[k] for k in inner)
            self.sync()
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            self.sync()
            total = (time.perf_counter() - t0) * 1e3
            self.totals[parts[-1]] += max(0.0, total - (sum(self.totals[k] for k in inner) - before))
            return out
        return wrapper

    @contextlib.contextmanager
    def installed(self):
        """Time the parts while inside: the engine's own attributes are wrapped, then restored."""
        e = self.engine
        wrapped = []   # (object, attribute, the instance's own value or None)

        def wrap(obj, attr, new):
            wrapped.append((obj, attr, vars(obj).get(attr)))
            setattr(obj, attr, new)

        draft = e.draft_model        # what the head drafts with (app/engine/draft_model.py)
        if e.head is not None:       # the head itself, or its forward on the fast kernels
            wrap(draft, "forward", _TimedCall(draft.forward, self._timed(draft.forward, "draft: head forwards")))
        wrap(draft, "logits", self._timed(draft.logits, "draft: LM head"))
        wrap(e, "decoder", _TimedCall(e.decoder, self._timed(e.decoder, "verify: target forward")))
        for verb, parts in _VERBS.items():
            wrap(e, verb, self._verb(getattr(e, verb), parts))
        try:
            yield self
        finally:
            for obj, attr, own in reversed(wrapped):
                if own is not None:
                    setattr(obj, attr, own)     # an attribute the instance had (engine.decoder)
                else:
                    delattr(obj, attr)          # back to the class attribute


def profile_tree(engine, tree, prompt: str, steps: int, warmup: int = 2) -> dict:
    """Mean ms per step for each part over ``steps`` steps (after ``warmup`` untimed ones)."""
    prof = StepProfiler(engine)
    n_steps, step_ms = 0, 0.0
    gen = engine.generate(prompt, tree=tree, sampling=SamplingConfig(), max_new_tokens=warmup + steps + 64)
    with prof.installed():
        for event in gen:
            if event.type != "step":
                break
            if event.step == warmup - 1:
                prof.totals.clear()          # the prefill (the prompt through the target and the head) and warm-up
            if event.step >= warmup:
                n_steps += 1
                step_ms += event.step_ms
            if n_steps >= steps:
                break
        gen.close()
    t = {k: v / max(1, n_steps) for k, v in prof.totals.items()}
    measured = sum(t.get(k, 0.0) for k in PARTS if k != "other")
    t["step"] = step_ms / max(1, n_steps)
    t["other"] = max(0.0, t["step"] - measured)
    t["steps"] = n_steps
    return t


def format_profile(label: str, t: dict) -> str:
    lines = [f"### {label}: {t['step']:.1f} ms per step (mean of {t['steps']} steps)", "",
             "| part | ms/step | share |", "|---|---|---|"]
    for k in PARTS:
        v = t.get(k, 0.0)
        lines.append(f"| {k} | {v:.1f} | {100 * v / t['step']:.0f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.bench.profile_step", description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default=None)
    p.add_argument("--draft-model", default=None, help="head folder (a random head is fine for cost; say so)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--trees", default="60/5/10,24/5/8,8/3/4,4/2/2", help="TOTAL/DEPTH/TOP_K list, plus 'vanilla'")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    p.add_argument("--prompt", default="Write a short story about a robot who learns to paint, in five paragraphs.")
    p.add_argument("--forward-costs", action="store_true", help="print the target's forward cost T(n) instead")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load = "%.2f" % os.getloadavg()[0]
    if args.forward_costs:
        target = load_target(args.base_model, device=args.device, dtype=args.dtype)
        curve = measure_forward_costs(target, sizes=(1, 8, 16, 24, 32, 48, 64), repeats=7)
        print(f"T(n), {target.name} {args.dtype} on {args.device}, {torch.get_num_threads()} threads, "
              f"load {load} -> {os.getloadavg()[0]:.2f}")
        print("| n | " + " | ".join(str(s) for s in curve.sizes) + " |")
        print("|---" * (len(curve.sizes) + 1) + "|")
        print("| ms | " + " | ".join(f"{m:.1f}" for m in curve.ms) + " |")
        return 0
    engine, _ = load_engine(args.base_model, args.draft_model, args.device, args.dtype)
    print(f"head: {args.draft_model or 'shipped'}; {engine.target.name} {args.dtype}, "
          f"{torch.get_num_threads()} threads, load average {load}")
    for spec in args.trees.split(","):
        if spec == "vanilla":
            tree = TreeConfig(method="vanilla")
        else:
            tree = TreeShape.parse(spec, "trees").config("dynamic")
        t = profile_tree(engine, tree, args.prompt, args.steps)
        print()
        print(format_profile(f"{tree.method} {spec}", t))
        sys.stdout.flush()
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
