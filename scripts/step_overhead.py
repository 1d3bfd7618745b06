"""A decoding step's time outside the C kernels: the Python and torch glue around them.

On the fast forward a step is one C call for the target's decoder stack, a few for LM heads
and the head's layer, and everything else in Python: building the tree, masks, the cache's
bookkeeping, acceptance, the step record, the text. That part is CPU-bound and steadier
than the memory-bound kernels on a shared machine, so it is what this measures: each
kernel call is timed, and the rest of the step is reported beside it.

    python scripts/step_overhead.py --method vanilla
    python scripts/step_overhead.py --method eagle        # 3/2/2 + a prompt-lookup branch of 3
    python scripts/step_overhead.py --method eagle --tree 4/2/8 --threads 2
    python scripts/step_overhead.py --method eagle --threads 2 --functions   # each function's own time
    # another revision, interleaved with this one by the shell:
    git worktree add /tmp/base <rev> && python scripts/step_overhead.py --root /tmp/base
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

PROMPTS = ["Explain how a bicycle works, step by step.", "Write a short poem about the sea.",
           "What is 17 times 23? Show your work.", "Summarize the plot of Hamlet in a paragraph."]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=["vanilla", "eagle"], default="eagle")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tree", default="3/2/2", help="eagle's tree: total/depth/top-k (a lookup branch of 3 beside it)")
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]),
                   help="the checkout whose app/ to import (a git worktree of another revision)")
    p.add_argument("--functions", action="store_true",
                   help="also time the engine's step functions and report each one's own time a step "
                        "(its time less the timed calls inside it), largest first")
    args = p.parse_args()
    sys.path.insert(0, args.root)
    import torch

    from app.engine import kernels
    from app.engine.config import TreeConfig
    from app.engine.factory import load_engine

    torch.set_num_threads(args.threads)
    inside = [0.0]

    def timed(f):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                inside[0] += time.perf_counter() - t
        return call

    for name in ("decoder", "linear", "attention", "rms_norm", "silu_mul", "rope_"):
        setattr(kernels, name, timed(getattr(kernels, name)))
    own = by_function() if args.functions else None
    engine, _ = load_engine(dtype="bfloat16")
    tree = (TreeConfig(method="vanilla") if args.method == "vanilla"
            else TreeConfig(method="dynamic", **dict(zip(("total_tokens", "depth", "top_k"),
                                                         map(int, args.tree.split("/")))), lookup=3))
    list(engine.generate(PROMPTS[0], tree=tree, max_new_tokens=16))          # warm-up
    inside[0], steps, t = 0.0, 0, time.perf_counter()
    for prompt in PROMPTS:
        steps += sum(1 for _ in engine.generate(prompt, tree=tree, max_new_tokens=args.max_new_tokens))
    total = time.perf_counter() - t
    if own is not None:
        spent, inner, calls = own
        for name in sorted(spent, key=lambda k: inner[k] - spent[k]):
            print(f"  {name:38s} own {(spent[name] - inner[name]) / steps * 1e3:6.3f} ms a step, "
                  f"{calls[name] / steps:5.2f} calls a step")
    print(f"{args.method} {args.threads} thread(s) ({os.path.basename(args.root.rstrip('/'))}): {steps} steps, {total / steps * 1e3:.2f} ms a step, "
          f"{inside[0] / steps * 1e3:.2f} in kernels, {(total - inside[0]) / steps * 1e3:.2f} outside; "
          f"load average {os.getloadavg()[0]:.2f}")


def by_function():
    """Wrap the step's functions (the engine's verbs, the drafting callbacks, the forwards, the
    cache's bookkeeping, every C kernel) so that each call adds its time to its own total and
    to its caller's inner time; returns (total, inner, calls) counters by name, filled as the
    engine runs. A function's own time is total - inner: the Python and torch work in its body."""
    from app.engine import engine as E
    from app.engine import head_draft, kernels, kv, rowwise, tree

    total, inner, calls, stack = collections.Counter(), collections.Counter(), collections.Counter(), []

    def wrap(name, f):
        def call(*a, **k):
            stack.append(name)
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                dt = time.perf_counter() - t
                stack.pop()
                total[name] += dt
                calls[name] += 1
                if stack:
                    inner[stack[-1]] += dt
        return call

    for name in ("decoder", "linear", "top_probs", "argmax", "keep_rows", "embed", "node_probs"):
        if hasattr(kernels, name):
            setattr(kernels, name, wrap("C " + name, getattr(kernels, name)))
    head_draft.read_pending = E.read_pending = wrap("read_pending", head_draft.read_pending)
    E.grow_tree = wrap("grow_tree", tree.grow_tree)
    for cls, names in ((head_draft.HeadDrafting, ("_features", "propose")),
                       (E.Engine, ("_step", "draft", "verify", "commit", "record_tree", "_with_lookup_branch")),
                       (rowwise.RowwiseDraftHead, ("__call__",)), (rowwise.RowwiseLlamaDecoder, ("__call__", "logits"))):
        for name in names:
            setattr(cls, name, wrap(f"{cls.__name__}.{name}", getattr(cls, name)))
    E.Engine.accept = staticmethod(wrap("Engine.accept", E.Engine.accept))
    for name in ("crop", "keep_positions", "reserve"):
        setattr(kv, name, wrap("kv." + name, getattr(kv, name)))
    return total, inner, calls


if __name__ == "__main__":
    main()
