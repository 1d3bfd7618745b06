"""Command-line arguments shared by ``generate``, ``bench`` and ``tune`` (not an entry point:
the entry points import from here)."""
from __future__ import annotations

import argparse

from app.engine.config import TreeConfig
from app.engine.spec import KNOB

_TREE = TreeConfig()


def add_tree_arguments(p: argparse.ArgumentParser) -> None:
    """Tree knobs. Leaving depth, top_k and total_tokens unset means "auto" for dynamic."""
    p.add_argument("--depth", type=int, default=None, help=f"levels of draft nodes per step (default {_TREE.depth}; dynamic: auto)")
    p.add_argument("--top-k", type=int, default=None, help=f"EAGLE-2 branching: nodes expanded per level, children per node (default {_TREE.top_k}; dynamic: auto)")
    p.add_argument("--total-tokens", type=int, default=None, help=f"draft nodes verified per step, at most, the root not counted (the reference EAGLE "
                        f"code's total_token=N counts it: pass N-1 here for the same tree; default "
                        f"{_TREE.total_tokens}; dynamic: auto)")
    KNOB["tau_high"].add_argument(p, help="threshold method: 2 children above this confidence")
    KNOB["tau_low"].add_argument(p, help="threshold method: 1 child above this confidence")
    KNOB["min_confidence"].add_argument(p, help="drop nodes below this confidence")
    for name in ("ngram", "window", "pool"):      # the drafters' knobs: help is the Setting's label
        KNOB[name].add_argument(p)
    KNOB["lookup"].add_argument(p, default=None, help=KNOB["lookup"].label.replace("(0 = off)", "(default: 0; "
                                "the auto tree: 3; 0 = off)"))


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-model", default=None, help="target: hub id or folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft-model", default=None, help="EAGLE head: hub id or folder (default: the shipped head)")
    p.add_argument("--medusa-model", default=None,
                   help="Medusa heads folder for the medusa method (default: models/medusa-smollm2-135m-instruct)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", default="auto",
                   help="auto (the faster of float32 and bfloat16 where the hardware has native bfloat16, "
                        "measured once) | float32 (exact: greedy output identical to plain decoding) | bfloat16 | float16")
    p.add_argument("--forward", default=None, choices=["auto", "eager"],
                   help="target forward on a CPU: auto (the fast batch-invariant kernels where this machine can build "
                        "them, else eager) | eager (transformers-based, the fast forward off); default "
                        "$EAGLE_LENS_FORWARD or auto")
    p.add_argument("--threads", default="auto",
                   help="CPU threads: auto (timed just before decoding: on a busy machine fewer threads can be "
                        "faster) or a number")
    p.add_argument("--full-draft-vocab", action="store_true",
                   help="let the head propose from the whole vocabulary even if it ships a reduced draft vocabulary")


def tree_config_from(args, method: str | None = None) -> TreeConfig:
    """The tree knobs given on the command line; unset size knobs take TreeConfig's defaults."""
    pick = lambda value, default: default if value is None else value  # noqa: E731
    return TreeConfig(method=method or args.method, depth=pick(args.depth, _TREE.depth),
                      top_k=pick(args.top_k, _TREE.top_k), total_tokens=pick(args.total_tokens, _TREE.total_tokens),
                      tau_high=args.tau_high, tau_low=args.tau_low, min_confidence=args.min_confidence,
                      ngram=getattr(args, "ngram", _TREE.ngram), window=getattr(args, "window", _TREE.window),
                      pool=getattr(args, "pool", _TREE.pool),
                      lookup=_TREE.lookup if getattr(args, "lookup", None) is None else args.lookup)


def wants_auto_tree(args) -> bool:
    """dynamic with none of depth / top_k / total_tokens given: size the tree for this machine."""
    return args.method == "dynamic" and args.depth is None and args.top_k is None and args.total_tokens is None


def threads_from(args) -> int | None:
    """``--threads``: None for auto, else the fixed count; ValueError for anything else.
    Needs no torch, so a bad value is refused before any import."""
    raw = getattr(args, "threads", "auto")
    if raw in (None, "auto"):
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"threads must be auto or a positive integer, got {raw!r}")
    return n


def thread_governor(args):
    """The ThreadGovernor for ``--threads`` (auto, or a fixed positive count)."""
    # lazy: threads.py imports torch; this module is read by every subcommand's --help and the page
    from app.engine.threads import ThreadGovernor

    n = threads_from(args)
    return ThreadGovernor() if n is None else ThreadGovernor(fixed=n)
