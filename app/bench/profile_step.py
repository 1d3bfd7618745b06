"""Where one decoding step's time goes: ``python -m app.bench.profile_step``.

    python -m app.bench.profile_step --draft-model /tmp/randhead --trees 60/5/10,24/5/8,8/3/4
    python -m app.bench.profile_step --forward-costs --dtype bfloat16

Instruments a real ``Engine`` by wrapping (never editing) the pieces one step is made of,
and times each with ``perf_counter`` (CUDA synchronised):

    target forward     the decoder stack over [root, nodes]    (engine.decoder)
    target LM head     logits for every verified row           (engine.lm_head outside drafting)
    draft head         the head's forwards, one per level      (engine.head)
    draft LM head      the full-vocabulary LM head on drafted features (engine.lm_head inside _draft)
    draft softmax+topk the proposals' softmax and top-k
    tree mask          tree.tree_attention_mask for the verify forward
    acceptance         verify.logits_to_probs + greedy/sequential verification
    cache ops          kv.keep_positions / kv.crop (KV commit and the head's crop)
    step record        Engine._tree_record (texts, p of each node) and detokenising
    python (draft)     the rest of drafting: tree policy bookkeeping, draft masks, tensors
    python (other)     the rest of the step

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

PARTS = ("target forward", "target LM head", "draft head", "draft LM head", "draft softmax+topk", "tree mask",
         "acceptance", "cache ops", "step record", "python (draft)", "python (other)")


class StepProfiler:
    """Wraps an engine's parts with timers; ``totals`` accumulates ms per part."""

    def __init__(self, engine, draft_lm_dtype: torch.dtype | None = None):
        self.engine = engine
        # Experiment (benchmarks/cpu-profile.md, reduced draft vocabulary): run the *draft's* LM head on a
        # copy of the weight in another dtype; the target's verify LM head is untouched.
        self.draft_lm_weight = (engine.lm_head.weight.detach().to(draft_lm_dtype)
                                if draft_lm_dtype is not None and draft_lm_dtype != engine.target.dtype else None)
        self.totals: dict[str, float] = defaultdict(float)
        self.in_draft = False
        self.sync = torch.cuda.synchronize if engine.target.device.type == "cuda" else (lambda: None)

    def _timed(self, fn, name_of):
        def wrapper(*a, **kw):
            self.sync()
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            self.sync()
            self.totals[name_of() if callable(name_of) else name_of] += (time.perf_counter() - t0) * 1e3
            return out
        return wrapper

    @contextlib.contextmanager
    def installed(self):
        import app.engine.engine as eng
        from app.engine import kv, verify

        e = self.engine
        patches = []   # (object, attribute, original)

        def patch(obj, attr, new):
            patches.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, new)

        patch(e.decoder, "forward", self._timed(e.decoder.forward, "target forward"))
        lm_forward = e.lm_head.forward

        def lm_head(x):
            if self.in_draft and self.draft_lm_weight is not None:
                w = self.draft_lm_weight
                return torch.nn.functional.linear(x.to(w.dtype), w).to(x.dtype)
            return lm_forward(x)
        patch(e.lm_head, "forward", self._timed(lm_head, lambda: "draft LM head" if self.in_draft else "target LM head"))
        if e.head is not None:
            patch(e.head, "forward", self._timed(e.head.forward, "draft head"))
        if e.draft_vocab is not None:   # the reduced draft vocabulary's matmul bypasses lm_head
            patch(e, "_draft_logits", self._timed(e._draft_logits, "draft LM head"))
        patch(eng, "tree_attention_mask", self._timed(eng.tree_attention_mask, "tree mask"))
        for name in ("greedy_verify", "sequential_verify", "chain_verify", "logits_to_probs"):
            patch(verify, name, self._timed(getattr(verify, name), lambda: "draft softmax+topk" if self.in_draft else "acceptance"))
        for name in ("keep_positions", "crop"):
            patch(kv, name, self._timed(getattr(kv, name), "cache ops"))
        patch(e, "_tree_record", self._timed(e._tree_record, "step record"))
        patch(e, "decode", self._timed(e.decode, "step record"))
        for name in ("softmax", "topk", "logsumexp"):
            original = getattr(torch, name)

            def during_draft_only(*a, _f=original, **kw):
                if not self.in_draft:
                    return _f(*a, **kw)
                t0 = time.perf_counter()
                out = _f(*a, **kw)
                self.totals["draft softmax+topk"] += (time.perf_counter() - t0) * 1e3
                return out
            patch(torch, name, during_draft_only)

        draft = e._draft

        def draft_wrapper(*a, **kw):
            before = {k: self.totals[k] for k in ("draft head", "draft LM head", "draft softmax+topk", "cache ops")}
            self.in_draft = True
            t0 = time.perf_counter()
            try:
                return draft(*a, **kw)
            finally:
                self.sync()
                self.in_draft = False
                total = (time.perf_counter() - t0) * 1e3
                inner = sum(self.totals[k] - v for k, v in before.items())
                self.totals["draft (all)"] += total
                self.totals["python (draft)"] += max(0.0, total - inner)
        patch(e, "_draft", draft_wrapper)
        try:
            yield self
        finally:
            for obj, attr, original in reversed(patches):
                if obj is e or obj is e.decoder or obj is e.lm_head or obj is e.head:
                    try:
                        delattr(obj, attr)      # back to the class attribute
                        continue
                    except AttributeError:
                        pass
                setattr(obj, attr, original)


def profile_tree(engine, tree, prompt: str, steps: int, warmup: int = 2, draft_lm_dtype=None) -> dict:
    """Mean ms per step for each part over ``steps`` steps (after ``warmup`` untimed ones)."""
    from app.engine.config import SamplingConfig

    prof = StepProfiler(engine, draft_lm_dtype)
    n_steps, step_ms = 0, 0.0
    gen = engine.generate(prompt, tree=tree, sampling=SamplingConfig(), max_new_tokens=warmup + steps + 64)
    with prof.installed():
        for event in gen:
            if event.type != "step":
                break
            if event.step == warmup - 1:
                prof.totals.clear()          # the first steps read the prompt into the head
            if event.step >= warmup:
                n_steps += 1
                step_ms += event.step_ms
            if n_steps >= steps:
                break
        gen.close()
    t = {k: v / max(1, n_steps) for k, v in prof.totals.items()}
    measured = sum(t.get(k, 0.0) for k in PARTS if k != "python (other)")
    t["step"] = step_ms / max(1, n_steps)
    t["python (other)"] = max(0.0, t["step"] - measured)
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
    from app.cli import build_engine
    from app.engine.config import TreeConfig

    p = argparse.ArgumentParser(prog="python -m app.bench.profile_step", description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default=None)
    p.add_argument("--draft-model", default=None, help="head folder (a random head is fine for cost; say so)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--trees", default="60/5/10,24/5/8,8/3/4,4/2/2", help="TOTAL/DEPTH/TOP_K list, plus 'vanilla'")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    p.add_argument("--prompt", default="Write a short story about a robot who learns to paint, in five paragraphs.")
    p.add_argument("--draft-lm-dtype", default=None, choices=("bfloat16", "float16", "float32"),
                   help="experiment: the draft's LM head on a copy of the weight in this dtype")
    p.add_argument("--forward-costs", action="store_true", help="print the target's forward cost T(n) instead")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load = "%.2f" % os.getloadavg()[0]
    if args.forward_costs:
        from app.engine.autotune import measure_forward_costs
        from app.engine.loading import load_target

        target = load_target(args.base_model, device=args.device, dtype=args.dtype)
        curve = measure_forward_costs(target, sizes=(1, 8, 16, 24, 32, 48, 64), repeats=7)
        print(f"T(n), {target.name} {args.dtype} on {args.device}, {torch.get_num_threads()} threads, "
              f"load {load} -> {os.getloadavg()[0]:.2f}")
        print("| n | " + " | ".join(str(s) for s in curve.sizes) + " |")
        print("|---" * (len(curve.sizes) + 1) + "|")
        print("| ms | " + " | ".join(f"{m:.1f}" for m in curve.ms) + " |")
        return 0
    engine = build_engine(args.base_model, args.draft_model, args.device, args.dtype, need_head=True)
    print(f"head: {args.draft_model or 'shipped'}; {engine.target.name} {args.dtype}, "
          f"{torch.get_num_threads()} threads, load average {load}")
    for spec in args.trees.split(","):
        if spec == "vanilla":
            tree = TreeConfig(method="vanilla")
        else:
            total, depth, top_k = (int(x) for x in spec.split("/"))
            tree = TreeConfig(method="dynamic", total_tokens=total, depth=depth, top_k=top_k)
        dl = getattr(torch, args.draft_lm_dtype) if args.draft_lm_dtype else None
        t = profile_tree(engine, tree, args.prompt, args.steps, draft_lm_dtype=dl)
        print()
        print(format_profile(f"{tree.method} {spec}" + (f" (draft LM head in {args.draft_lm_dtype})" if dl else ""), t))
        sys.stdout.flush()
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
