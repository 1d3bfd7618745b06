"""Tokens/s of trees with a prompt-lookup branch whose nodes are added on top of the head's
(``add``) or take the places of the head's least confident ones (``place``), against our
vanilla, interleaved prompt by prompt over the six suites (2 prompts each, 128 tokens, greedy).

The engine decides this by its verify forward's free rows (``Engine.free_rows``, see
``Engine._with_lookup_branch``); here it is forced either way to measure both:

    python scripts/lookup_budget.py 3/2/2:3:add 3/2/2:3:place 2/1/2:3:add 2/1/2:3:place
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python scripts/lookup_budget.py ...

Each argument is TOTAL/DEPTH/TOP_K:LOOKUP:add|place. Prints, per suite and pooled, each
tree's tokens/s as a multiple of vanilla's, and its tau.
"""
from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.bench.prompts import load_suite  # noqa: E402
from app.engine.config import TreeConfig, TreeShape  # noqa: E402
from app.engine.factory import load_engine  # noqa: E402

SUITES = ("alpaca", "gsm8k", "humaneval", "mt_bench", "qa", "sum")


def main() -> None:
    torch.set_num_threads(1)
    engine, _ = load_engine()
    rows = [("vanilla", TreeConfig(method="vanilla"), None)]
    for spec in sys.argv[1:]:
        shape, lookup, mode = spec.split(":")
        if mode not in ("add", "place"):
            raise SystemExit(f"mode must be add or place, got {mode!r}")
        # add: no row limit; place: the branch fits within total_tokens (no free rows past the root)
        rows.append((spec, TreeShape.parse(shape).config(base=TreeConfig(lookup=int(lookup))), None if mode == "add" else 1))
    totals = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0, 0]))   # tokens, s, steps
    for suite in SUITES:
        for prompt in load_suite(suite, 2):
            ids = engine.encode_prompt(prompt.text)
            for name, tree, free_rows in rows:
                engine.free_rows = free_rows
                steps = list(engine.generate(prompt_ids=ids, tree=tree, max_new_tokens=128))[1:-1]
                for key in (suite, "all"):
                    t = totals[key][name]
                    t[0] += sum(len(s.new_tokens) for s in steps)
                    t[1] += sum(s.step_ms for s in steps) / 1000
                    t[2] += len(steps)
    for key in ("all",) + SUITES:
        vanilla = totals[key]["vanilla"][0] / totals[key]["vanilla"][1]
        print(key, " ".join(f"{name}={t[0] / t[1] / vanilla:.2f}x (tau {t[0] / t[2]:.2f})"
                            for name, t in totals[key].items()))


if __name__ == "__main__":
    main()
