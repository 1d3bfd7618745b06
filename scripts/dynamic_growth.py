"""Step time of dynamic (EAGLE-2) trees grown two ways, interleaved prompt by prompt: the full
expansion (every expanded node proposes top_k children, the top_k best new nodes of a level
are expanded) and the engine's growth, which skips what the final rerank can never keep
(``app.engine.tree._useful``). Both keep the same tree, so the output must be the same text.

    python scripts/dynamic_growth.py --trees 4/2/8,8/3/8 --rounds 4 --threads 2
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python scripts/dynamic_growth.py ...

Prints, per tree, the median of the per-prompt ratios (grown / full ms per step, each pair
decoded back to back, the order swapped every round) and the median ms per step of each.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from app.engine import tree as tree_policy  # noqa: E402
from app.engine.config import TreeConfig, TreeShape  # noqa: E402
from app.engine.factory import load_engine  # noqa: E402

PROMPTS = ("Explain how a bicycle works, step by step.", "Write a short poem about the sea.",
           "What is 17 times 23? Show your work.", "Summarise the plot of Romeo and Juliet.")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", default="4/2/8,8/3/8", help="total_tokens/depth/top_k list")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine, _ = load_engine(None, None, "cpu", args.dtype)
    grown = tree_policy._useful
    growths = {"full": lambda cfg, depth: cfg.top_k, "grown": grown}
    trees = [TreeShape.parse(t).config("dynamic") for t in args.trees.split(",")]
    print(f"# {platform.processor() or platform.machine()}, dtype {engine.target.dtype}, "
          f"{args.threads} threads, load average at start {os.getloadavg()[0]:.2f}")
    ratios: dict[str, list[float]] = {}
    ms: dict[tuple[str, str], list[float]] = {}
    same = True
    for rnd in range(args.rounds):
        order = ("full", "grown") if rnd % 2 == 0 else ("grown", "full")
        for cfg in trees:
            name = str(TreeShape.of(cfg))
            for prompt in PROMPTS:
                step_ms, texts = {}, {}
                for growth in order:
                    tree_policy._useful = growths[growth]
                    try:
                        events = list(engine.generate(prompt, tree=cfg, max_new_tokens=args.max_new_tokens))
                    finally:
                        tree_policy._useful = grown
                    summary = events[-1]
                    step_ms[growth] = summary.seconds / summary.target_forwards * 1000
                    texts[growth] = "".join(e.text for e in events[:-1])
                    ms.setdefault((name, growth), []).append(step_ms[growth])
                same &= texts["full"] == texts["grown"]
                ratios.setdefault(name, []).append(step_ms["grown"] / step_ms["full"])
    print("| tree | full ms/step | grown ms/step | grown / full (median of pairs) | pairs |")
    print("|---|---|---|---|---|")
    for name, r in ratios.items():
        print(f"| {name} | {statistics.median(ms[(name, 'full')]):.1f} | {statistics.median(ms[(name, 'grown')]):.1f} "
              f"| {statistics.median(r):.3f} | {len(r)} |")
    print(f"\nsame text from both: {same}; load average at end {os.getloadavg()[0]:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
