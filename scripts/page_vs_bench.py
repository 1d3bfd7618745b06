"""Does the page report the speedup the benchmark measures? Same prompt, same tree, same engine.

Each round runs (1) the page's Generate handler with its race (the run and a fresh vanilla run
interleaved in chunks of 16 tokens; the speedup the page prints) and (2) the benchmark's runner
for vanilla and the same tree on the same prompt (``app.bench.runners.run_one``, the ratio of
tokens/s its tables print), alternating, with the load average at each round.

    .venv/bin/python scripts/page_vs_bench.py --suite mt_bench --question 0 --tree 2/2/1 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="mt_bench")
    p.add_argument("--question", type=int, default=0, help="index of the prompt in the suite")
    p.add_argument("--tree", default="2/2/1", help="TOTAL/DEPTH/TOP_K of the dynamic tree")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    from app.bench.prompts import load_suite
    from app.bench.runners import MethodSpec, run_one
    from app.engine.config import SamplingConfig, TreeConfig, TreeShape
    from app.engine.factory import load_engine
    from app.ui import handlers
    from app.ui.session import Session
    from app.ui.settings import AppContext, ServerConfig
    from app.viz.race import speedup

    torch.set_num_threads(args.threads)
    shape = TreeShape.parse(args.tree)
    prompt = load_suite(args.suite, args.question + 1)[args.question].text
    engine, _ = load_engine(dtype="float32")
    ctx = AppContext(engine, ServerConfig(max_new_tokens=args.max_new_tokens, update_interval_s=1.0), "check")
    from app.engine.threads import ThreadGovernor

    ctx.threads = ThreadGovernor(fixed=args.threads)
    tree = shape.config("dynamic")
    ids = engine.encode_prompt(prompt)
    sampling = SamplingConfig(temperature=0.0)
    specs = [MethodSpec("vanilla", "vanilla", TreeConfig(method="vanilla")), MethodSpec(args.tree, "dynamic", tree)]
    for spec in specs:                                    # warm-up, as the benchmark does
        run_one(engine, spec, "warmup", -1, ids, sampling, 16, None)
    page, bench = [], []
    print(f"{args.suite} #{args.question}, tree {args.tree}, {args.max_new_tokens} tokens, {args.threads} thread(s)")
    print("| round | load | page (race) | bench (× vanilla) | page / bench |\n|---|---|---|---|---|")
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        session = Session()
        for _ in handlers.generate(ctx, session, race=True, prompt=prompt, method="dynamic", **shape.knobs(),
                                   max_new_tokens=args.max_new_tokens, temperature=0.0,
                                   adapt=False):
            pass
        page.append(speedup(session.steps, session.race_vanilla.steps))
        runs = {s.label: run_one(engine, s, args.suite, args.question, ids, sampling, args.max_new_tokens, None)
                for s in (specs if r % 2 == 0 else specs[::-1])}
        tps = {label: rec.tokens_per_s for label, rec in runs.items()}
        bench.append(tps[args.tree] / tps["vanilla"])
        print(f"| {r + 1} | {load:.2f} | {page[-1]:.3f} | {bench[-1]:.3f} | {page[-1] / bench[-1]:.3f} |", flush=True)
    ratio = statistics.median(page) / statistics.median(bench)
    print(f"\nmedians: page {statistics.median(page):.3f}, bench {statistics.median(bench):.3f}, "
          f"page/bench {ratio:.3f} (within ±15%: {'yes' if abs(ratio - 1) <= 0.15 else 'no'}); "
          f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
