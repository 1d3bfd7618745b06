"""Record the shipped demo traces: `python -m app.ui.record --shipped` (or one trace per example
category with the flags' settings: `python -m app.ui.record [--out traces] [--max-new-tokens 64]`).

Runs each example prompt through the same handler the page uses, with the server's real engine
(the embedded model and the shipped head unless the EAGLE_LENS_* variables say otherwise), race
included, and writes one trace per demo. The traces say which model, device and dtype produced
them; a visitor replays them with no model at all, and loading one sets the page's controls to
its settings.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
import os
import sys

from app.engine.spec import KNOB
from app.ui import handlers, traces
from app.ui.explain import EXAMPLES
from app.ui.session import Session
from app.ui.settings import ServerConfig, load_context


# The shipped demos (``--shipped``): name, example category, settings. Each teaches one thing:
# 1-chat opens the page (a branchy tree small enough to read every node, and one that pays on
# the fast forward: root + 7 nodes fill one 8-row register block with AVX-512, where 8/3/4's
# ninth row cost a second block, 1.23x against 1.59x vanilla at the same tau 2.10), 2-code a
# plain chain on text the head drafts well, 3-math a run that adapts its tree while decoding,
# 4-summary the tree tuned for the recording machine (`python -m app tune`: 4 / 2 / 8 on the
# 2-core EPYC with native bfloat16), 5-code-big-tree
# the EAGLE-2 paper's GPU tree (60 / 5 / 10: a forward over 61 rows costs ~4x one over 1 on a
# CPU core, so it loses time there), 6-chat-sampled sampled verification (a chain drafted
# from q, kept with min(1, p/q)).
SHIPPED = (
    ("1-chat", "chat", dict(depth=3, top_k=4, total_tokens=7)),
    ("2-code", "code", dict(depth=5, top_k=1, total_tokens=5)),
    ("3-math", "math", dict(depth=4, top_k=4, total_tokens=16, adapt=True)),
    ("4-summary", "summary", dict(depth=2, top_k=8, total_tokens=4)),
    ("5-code-big-tree", "code", dict(depth=5, top_k=10, total_tokens=60)),
    ("6-chat-sampled", "chat", dict(depth=3, top_k=1, total_tokens=3, temperature=0.8, seed=1)),
)


def record(ctx, prompt: str, dest: str, head_label: str | None = None, **settings) -> None:
    """Run ``prompt`` with ``settings`` through the page's handler (race included) and write
    its trace to ``dest``; print one line on it."""
    session = Session()
    view = list(handlers.generate(ctx, session, prompt=prompt, **settings))[-1]
    with open(view["trace_file"], encoding="utf-8") as f:
        data = json.load(f)
    if head_label:
        data["model"]["head"] = head_label
    with open(dest, "w", encoding="utf-8") as f:
        f.write(traces.dumps(data))
    s, v = session.summary, session.race_vanilla.summary
    print(f"{dest}: {s.new_tokens} tokens, tau {s.mean_accepted:.2f}, {s.tokens_per_s:.1f} tokens/s "
          f"vs vanilla {v.tokens_per_s:.1f} tokens/s; {view['speedup'].splitlines()[-1]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="traces")
    KNOB["max_new_tokens"].add_argument(p, default=64, help="tokens per trace (64: a demo that loads fast)")
    KNOB["method"].add_argument(p)
    # Without --shipped: one trace per example category with these tree flags (for the shipped
    # set, SHIPPED above holds each demo's own settings).
    for name in ("depth", "top_k", "total_tokens"):
        KNOB[name].add_argument(p)
    p.add_argument("--head-label", default=None,
                   help="how the trace names the draft head (e.g. 'untrained placeholder'); default: its source")
    KNOB["temperature"].add_argument(p)
    KNOB["seed"].add_argument(p)
    p.add_argument("--only", default=None, help="record only this example category (chat, code, math, summary)")
    p.add_argument("--name", default=None, help="file name (without .json) for the one trace of --only")
    p.add_argument("--shipped", action="store_true",
                   help="record the shipped demo set (SHIPPED: each demo's own settings; the tree flags are ignored)")
    args = p.parse_args(argv)
    if args.name and not args.only:
        p.error("--name needs --only (it names one trace)")
    ctx = load_context(replace(ServerConfig.from_env(), auto_tree=False))   # the tree comes from the flags
    if not ctx.has_head:
        print(f"error: {ctx.head_missing}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    prompts = dict(EXAMPLES)
    if args.shipped:
        for name, category, settings in SHIPPED:
            if args.only and category != args.only:
                continue
            record(ctx, prompts[category], os.path.join(args.out, f"{name}.json"), args.head_label,
                   **{"method": "dynamic", "max_new_tokens": args.max_new_tokens, **settings})
        return 0
    for i, (category, prompt) in enumerate(EXAMPLES, 1):
        if args.only and category != args.only:
            continue
        record(ctx, prompt, os.path.join(args.out, f"{args.name or f'{i}-{category}'}.json"), args.head_label,
               method=args.method, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
               seed=args.seed, depth=args.depth, top_k=args.top_k, total_tokens=args.total_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
