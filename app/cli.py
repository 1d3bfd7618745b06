"""`python -m app generate`: decode one prompt and print the text or the step records.

Bad input (an out-of-range knob, an empty prompt, a missing model or head) prints one line
on stderr and exits 2; it never falls back to a random draft head.
"""
from __future__ import annotations

import argparse
import json
import sys

from app.engine.config import METHODS, SamplingConfig, TreeConfig

_TREE = TreeConfig()
_SAMPLING = SamplingConfig()


def add_tree_arguments(p: argparse.ArgumentParser) -> None:
    """Tree knobs shared by `generate` and `bench`."""
    p.add_argument("--depth", type=int, default=None, help=f"levels of draft nodes per step (default {_TREE.depth}; dynamic: auto)")
    p.add_argument("--top-k", type=int, default=None, help=f"EAGLE-2 branching: nodes expanded per level, children per node (default {_TREE.top_k}; dynamic: auto)")
    p.add_argument("--total-tokens", type=int, default=None, help=f"draft nodes verified per step, at most (default {_TREE.total_tokens}; dynamic: auto)")
    p.add_argument("--tau-high", type=float, default=_TREE.tau_high, help="threshold method: 2 children above this confidence")
    p.add_argument("--tau-low", type=float, default=_TREE.tau_low, help="threshold method: 1 child above this confidence")
    p.add_argument("--min-confidence", type=float, default=_TREE.min_confidence, help="drop nodes below this confidence")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-model", default=None, help="target: hub id or folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft-model", default=None, help="EAGLE head: hub id or folder (default: the shipped head)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--full-draft-vocab", action="store_true",
                   help="let the head propose from the whole vocabulary even if it ships a reduced draft vocabulary")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", required=True, help="one user message (through the chat template unless --raw)")
    p.add_argument("--method", default="dynamic", help=f"one of {', '.join(METHODS)}")
    add_tree_arguments(p)
    p.add_argument("--temperature", type=float, default=_SAMPLING.temperature, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=_SAMPLING.top_p)
    p.add_argument("--top-k-sampling", type=int, default=_SAMPLING.top_k_sampling, help="truncate the target's sampling distribution (0 = off)")
    p.add_argument("--seed", type=int, default=_SAMPLING.seed)
    p.add_argument("--max-new-tokens", type=int, default=256)
    add_model_arguments(p)
    p.add_argument("--raw", action="store_true", help="use the prompt as is, without the chat template")
    p.add_argument("--jsonl", action="store_true", help="print each step record and the summary as JSON lines")


def tree_config_from(args, method: str | None = None) -> TreeConfig:
    """The tree knobs given on the command line; unset size knobs take TreeConfig's defaults."""
    pick = lambda value, default: default if value is None else value  # noqa: E731
    return TreeConfig(method=method or args.method, depth=pick(args.depth, _TREE.depth),
                      top_k=pick(args.top_k, _TREE.top_k), total_tokens=pick(args.total_tokens, _TREE.total_tokens),
                      tau_high=args.tau_high, tau_low=args.tau_low, min_confidence=args.min_confidence)


def wants_auto_tree(args) -> bool:
    """dynamic with none of depth / top_k / total_tokens given: size the tree for this machine."""
    return args.method == "dynamic" and args.depth is None and args.top_k is None and args.total_tokens is None


def auto_tree(engine, base: TreeConfig) -> TreeConfig:
    """The hardware-aware tree (app.engine.autotune), announced on stderr with its reasons."""
    from app.engine.autotune import choose_tree, cost_curve_text

    tree, report = choose_tree(engine, base=base, progress=lambda m: print(f"[auto] {m}", file=sys.stderr, flush=True))
    print(f"[auto] {report.summary()}", file=sys.stderr, flush=True)
    print(f"[auto] measured forward cost T(n), n query tokens: "
          f"{cost_curve_text(report.cost_curve.sizes, report.cost_curve.ms)}", file=sys.stderr, flush=True)
    if not report.beats_vanilla:
        print("[auto] note: with this head on this machine vanilla decoding is predicted to be faster; "
              "decoding with the tree anyway, as asked (--method vanilla for the baseline)", file=sys.stderr, flush=True)
    return tree


def build_engine(base_model=None, draft_model=None, device="auto", dtype="auto", need_head=True,
                 full_draft_vocab=False):
    """Load target (and head, and the head's reduced draft vocabulary if it ships one) and
    wrap them in an Engine. Errors name what is wrong."""
    from app.engine.engine import Engine
    from app.engine.loading import load_draft_head, load_draft_vocab, load_target

    target = load_target(base_model, device=device, dtype=dtype)
    head = load_draft_head(draft_model, target) if need_head else None
    vocab = None
    if head is not None and not full_draft_vocab:
        vocab = load_draft_vocab(head.folder, target.model.config.vocab_size)
    return Engine(target, head, draft_vocab=vocab)


def main(args) -> int:
    try:
        tree = tree_config_from(args)
        sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p,
                                  top_k_sampling=args.top_k_sampling, seed=args.seed)
        from app.engine.config import check_max_new_tokens, check_prompt
        check_prompt(args.prompt)
        check_max_new_tokens(args.max_new_tokens)
        engine = build_engine(args.base_model, args.draft_model, args.device, args.dtype,
                              need_head=tree.uses_draft, full_draft_vocab=args.full_draft_vocab)
        if wants_auto_tree(args):
            tree = auto_tree(engine, tree)
        events = engine.generate(args.prompt, tree=tree, sampling=sampling,
                                 max_new_tokens=args.max_new_tokens, raw=args.raw)
    except (ValueError, FileNotFoundError, KeyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for event in events:
        if args.jsonl:
            print(json.dumps(event.to_dict(), ensure_ascii=False), flush=True)
        elif event.type == "step":
            print(event.text, end="", flush=True)
        else:
            print()
            print(f"[{event.method}] {event.new_tokens} tokens in {event.seconds:.2f} s = "
                  f"{event.tokens_per_s:.1f} tokens/s, {event.target_forwards} target forwards, "
                  f"mean accepted tokens per forward (tau) {event.mean_accepted:.2f}", file=sys.stderr)
    return 0
