"""The adaptive default tree (``app.engine.adapt``) against a baseline version of itself and
against fixed trees, interleaved prompt by prompt over the evaluation suites.

    python scripts/adaptive_ab.py --baseline 9823580 --limit 4 --threads 2
    python scripts/adaptive_ab.py --draft-weights head --fixed 3/2/2,4/2/8 --limit 2
    python scripts/adaptive_ab.py --max-chain 3 --fixed 3/3/1 --limit 2
    python scripts/adaptive_ab.py --head eagle3 --candidates vanilla,1/1/1,2/2/1,3/3/1,3/2/2,4/2/2,8/4/2 --limit 2
    python scripts/adaptive_ab.py --kernels HEAD --limit 4          # the same methods on HEAD's kernels
    python scripts/adaptive_ab.py --variant decay=0.1 --variant explore_every=24 --limit 4
    python scripts/adaptive_ab.py --candidates vanilla,2/2/1,3/2/2 --limit 4   # a smaller candidate set
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python scripts/adaptive_ab.py ...

Every method decodes every prompt greedily (128 new tokens), the methods' order rotating from
prompt to prompt so that a slow minute falls on each of them in turn. ``--baseline REV`` loads
``app/engine/adapt.py`` as it was at git revision REV beside today's (its own module, the
same engine, the same candidates and priors), so a change to the bandit is measured against
what it replaced in one process. ``--draft-weights head`` adds the adaptive default and the
fixed trees once more on a second engine over the same target whose draft reads the head's
own weights (``Engine(draft_weights="head")``) instead of int8; ``--max-chain D`` adds the
adaptive default with top-1 chains up to depth D among its candidates; ``--variant`` adds it with
other ``TreeAdapter`` settings (its estimates' decay, how often it explores) and ``--candidates``
over only the trees listed (with the default's prompt-lookup branch); ``--kernels REV`` (a git
revision or a ``rowwise.c`` file) adds vanilla, the adaptive default and the fixed trees once
more on that build of the kernels, swapped in for each of their generations, so that a
kernel change is measured end to end against what it replaced. Prints tokens per second of
each method (decoded tokens over the decoding steps' time, prefill excluded, pooled over the
prompts), its ratio to vanilla, tokens per step, the median step and drafting time (medians:
a neighbour's burst moves them less than the pooled rate), and how many steps each adaptive
run spent on each tree.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from app.bench.cli import _machine  # noqa: E402
from app.bench.prompts import load_suite  # noqa: E402
from app.engine import adapt, kernels  # noqa: E402
from app.engine.config import SamplingConfig, TreeConfig, TreeShape  # noqa: E402
from app.engine.engine import Engine  # noqa: E402
from app.engine.factory import load_engine  # noqa: E402

SUITES = ("alpaca", "gsm8k", "humaneval", "mt_bench", "qa", "sum")


def adapt_at(rev: str):
    """``app/engine/adapt.py`` as it was at git revision ``rev``, imported as its own module."""
    source = subprocess.run(["git", "show", f"{rev}:app/engine/adapt.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"adapt_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"adapt_{rev}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default=None, help="git revision of the adapter to compare against")
    p.add_argument("--fixed", default="3/2/2", help="fixed trees (total/depth/top_k list), with the default branch")
    p.add_argument("--limit", type=int, default=2, help="prompts per suite")
    p.add_argument("--suites", default=",".join(SUITES), help="comma-separated evaluation suites")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-chain", type=int, default=None,
                   help="also run the adaptive default with top-1 chains up to this depth among its candidates")
    p.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                   help="add the adaptive default with these TreeAdapter settings (e.g. decay=0.1,explore_every=24); repeatable")
    p.add_argument("--candidates", action="append", default=[], metavar="TREE[,TREE..]",
                   help="add the adaptive default over only these trees (total/depth/top_k, 'vanilla'), "
                        "with the default's prompt-lookup branch; repeatable")
    p.add_argument("--kernels", default=None, metavar="REV",
                   help="also run vanilla, adaptive and the fixed trees on the kernels of this git revision or .c file")
    p.add_argument("--head", default=None,
                   help="draft head: a shipped name (eagle2, eagle3) or a folder (default: the shipped EAGLE-2 head)")
    p.add_argument("--draft-weights", choices=("head",), default=None,
                   help="also run the adaptive and fixed trees with the draft on the head's own weights")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine, _ = load_engine(None, args.head, "cpu", args.dtype)
    start, adapter, _ = adapt.adapter_for(engine, TreeConfig(), measure=True)
    lookup = adapt.auto_lookup(engine)
    methods = {"vanilla": lambda: (engine, adapt.VANILLA, None),
               "adaptive": lambda: (engine, start, adapt.TreeAdapter(adapter.candidates, prior_tau=adapter.prior_tau))}
    # the tuned tree among the candidates (the other adapters get it too)
    best = next((t for t in adapter.candidates if t.uses_draft and adapt._same(t, start)), None)
    if args.baseline:
        old = adapt_at(args.baseline)
        # the baseline's own candidate set, from the same tuned tree and branch
        old_candidates = old.default_candidates(best, base=replace(TreeConfig(), lookup=lookup),
                                                **({"free_rows": engine.free_rows} if "free_rows" in
                                                   inspect.signature(old.default_candidates).parameters else {}))
        methods[f"adaptive@{args.baseline}"] = lambda: (engine, start, old.TreeAdapter(old_candidates,
                                                                                        prior_tau=adapter.prior_tau))
    if args.max_chain:
        deeper = adapt.default_candidates(best, max_chain=args.max_chain, base=replace(TreeConfig(), lookup=lookup))
        methods[f"adaptive, chains to {args.max_chain}"] = lambda: (
            engine, start, adapt.TreeAdapter(deeper, prior_tau=adapter.prior_tau))
    for variant in args.variant:
        settings = {k: float(v) if "." in v else int(v) for k, v in (kv.split("=") for kv in variant.split(","))}
        methods[f"adaptive, {variant}"] = lambda settings=settings: (
            engine, start, adapt.TreeAdapter(adapter.candidates, prior_tau=adapter.prior_tau, **settings))
    for listed in args.candidates:
        trees = [adapt.VANILLA if spec == "vanilla" else replace(TreeShape.parse(spec).config("dynamic"), lookup=lookup)
                 for spec in listed.split(",")]
        methods[f"adaptive over {listed}"] = lambda trees=trees: (
            engine, next((t for t in trees if adapt._same(t, start)), trees[-1]),
            adapt.TreeAdapter(trees, prior_tau=adapter.prior_tau))
    fixed = [replace(TreeShape.parse(spec).config("dynamic"), lookup=lookup) for spec in filter(None, args.fixed.split(","))]
    for tree in fixed:
        methods[f"{TreeShape.of(tree)}+lookup{lookup}"] = lambda tree=tree: (engine, tree, None)
    if args.draft_weights:
        other = Engine(engine.target, engine.head, draft_vocab=engine.draft_vocab, draft_weights=args.draft_weights)
        methods[f"adaptive, {args.draft_weights} weights"] = lambda: (
            other, start, adapt.TreeAdapter(adapter.candidates, prior_tau=adapter.prior_tau))
        for tree in fixed:
            methods[f"{TreeShape.of(tree)}+lookup{lookup}, {args.draft_weights} weights"] = \
                lambda tree=tree: (other, tree, None)
    swapped = {}                                  # method name -> the kernels library it runs on
    if args.kernels:
        spec = importlib.util.spec_from_file_location("forward_kernels", ROOT / "scripts" / "forward_kernels.py")
        forward_kernels = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(forward_kernels)
        lib = forward_kernels.baseline_kernels(args.kernels)
        for name in ["vanilla", "adaptive"] + [f"{TreeShape.of(tree)}+lookup{lookup}" for tree in fixed]:
            methods[f"{name}@{args.kernels}"] = methods[name]
            swapped[f"{name}@{args.kernels}"] = lib
    prompts = [q for suite in args.suites.split(",") for q in load_suite(suite, args.limit)]
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in kernels.cpu_flags()]
    print(f"# {_machine()}; flags {' '.join(isa)}; fast kernels {kernels.load().kind}; dtype {engine.target.dtype}, "
          f"{args.threads} threads, {len(prompts)} prompts, load average at start {os.getloadavg()[0]:.2f}")
    tokens, seconds, steps = collections.Counter(), collections.Counter(), collections.Counter()
    step_ms, draft_ms = collections.defaultdict(list), collections.defaultdict(list)
    used: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    names = list(methods)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[:i % len(names)]:
            runner, tree, bandit = methods[name]()
            own = kernels._lib
            kernels._lib = swapped.get(name, own)
            for event in runner.generate(prompt.text, tree=tree, sampling=SamplingConfig(),
                                         max_new_tokens=args.max_new_tokens, adapt=bandit):
                if event.type == "summary" or event.prefill:
                    continue
                tokens[name] += len(event.new_tokens)
                seconds[name] += event.step_ms / 1e3
                steps[name] += 1
                step_ms[name].append(event.step_ms)
                draft_ms[name].append(event.draft_ms)
                if bandit is not None:
                    used[name][TreeShape.key(event.tree_config)] += 1
            kernels._lib = own
    base = tokens["vanilla"] / seconds["vanilla"]
    if args.kernels:
        print(f"\n(methods named @{args.kernels} ran on its kernels; their 'x vanilla' is against today's vanilla: "
              f"vanilla@{args.kernels} is the row for the ratio within that build)")
    print("\n| method | tokens/s | x vanilla | tokens a step | ms a step (median) | of it drafting (median) | "
          "steps per tree |\n|---|---|---|---|---|---|---|")
    for name in names:
        rate = tokens[name] / seconds[name]
        trees = ", ".join(f"{k} {v}" for k, v in sorted(used[name].items(), key=lambda kv: -kv[1]))
        print(f"| {name} | {rate:.1f} | {rate / base:.3f} | {tokens[name] / steps[name]:.2f} | "
              f"{statistics.median(step_ms[name]):.1f} | {statistics.median(draft_ms[name]):.2f} | {trees or '-'} |")
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
