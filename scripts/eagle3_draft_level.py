"""One draft level of the shipped EAGLE-3 head: its eager forward against the fast kernels'.

A draft level runs the head over the frontier's F rows (each reading its parent's state and
its token's embedding, attending to C committed pairs) and then its norm and LM head over
the draft vocabulary. Three forms, alternated round by round so that load hits them alike:

    eager       the head's own forward and logits (transformers' attention, bfloat16 weights)
    fast-bf16   ``rowwise.RowwiseEagle3Head`` on the head's own bfloat16 weights
    fast-int8   the same on int8 weights (the engine's default draft)

Prints the median milliseconds of a level per form and F. The weights stay in the caches
between levels here (a step's target stream evicts them), so a step's draft costs somewhat
more than this; ``python -m app bench`` gives the share of a step.

    python scripts/eagle3_draft_level.py --threads 2
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.engine import kernels, kv  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--context", type=int, default=300, help="committed pairs in the head's cache (C)")
    p.add_argument("--rows", default="1,4,10", help="frontier sizes F")
    args = p.parse_args()
    if kernels.load() is None:
        print(f"fast kernels unavailable: {kernels.why_not()}")
        return 1
    from app.engine.factory import load_engine
    from app.engine.rowwise import RowwiseEagle3Head

    torch.set_num_threads(args.threads)
    engine, _ = load_engine(draft_model="eagle3", device="cpu", dtype="bfloat16")
    head = engine.head.eval()
    H, C = head.config.hidden_size, args.context
    forms = {"eager": (head, head.fc.weight.dtype),
             "fast-bf16": (RowwiseEagle3Head(head, int8=False), torch.float32),
             "fast-int8": (RowwiseEagle3Head(head, int8=True), torch.float32)}
    g = torch.Generator().manual_seed(0)
    context = (torch.randn(1, C, H, generator=g), torch.randn(1, C, 3 * H, generator=g))   # emb, target taps
    rows = [int(f) for f in args.rows.split(",")]
    level = {F: (torch.randn(1, F, H, generator=g), torch.randn(1, F, H, generator=g)) for F in rows}
    caches = {}
    with torch.inference_mode():
        for name, (forward, dtype) in forms.items():     # each form's cache holds the C committed pairs
            caches[name] = kv.preallocated_cache(None, C + max(rows) + 16)
            causal = torch.ones(C, C, dtype=torch.bool).tril()[None, None]
            forward(context[0].to(dtype), context[1].to(dtype), torch.arange(C)[None], causal, caches[name])
    times = {(name, F): [] for name in forms for F in rows}
    load = os.getloadavg()[0]
    with torch.inference_mode():
        for _ in range(args.rounds):
            for F in rows:
                mask = torch.ones(F, C + F, dtype=torch.bool)[None, None]   # each row: the context and itself
                mask[0, 0, :, C:] = torch.eye(F, dtype=torch.bool)
                for name, (forward, dtype) in forms.items():
                    emb, state = (t.to(dtype) for t in level[F])
                    t0 = time.perf_counter()
                    out = forward(emb, state, torch.full((1, F), C), mask, caches[name])
                    forward.logits(out[0])
                    times[(name, F)].append(time.perf_counter() - t0)
                    kv.crop(caches[name], C)
    print(f"threads {args.threads}, context {C}, kernels {kernels.load().kind}, "
          f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print("| F | " + " | ".join(forms) + " |")
    print("|---|" + "---|" * len(forms))
    for F in rows:
        cells = [f"{statistics.median(times[(name, F)][5:]) * 1e3:.2f}" for name in forms]
        print(f"| {F} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
