"""`python -m app generate`: decode one prompt and print the text or the step records.

Bad input (an out-of-range knob, an empty prompt, a missing model or head) prints one line
on stderr and exits 2; it never falls back to a random draft head.
"""
from __future__ import annotations

import argparse
import json
import sys

from app.args import (add_model_arguments, add_tree_arguments, thread_governor, threads_from, tree_config_from,
                      wants_auto_tree)
from app.engine.config import SamplingConfig, TreeConfig, TreeShape, check_max_new_tokens, check_prompt
from app.engine.drafters.registry import DEFAULT_HEAD_KIND
from app.engine.sources import DEFAULTS, check_before_loading
from app.engine.spec import KNOB, METHODS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", required=True, help="one user message (through the chat template unless --raw)")
    KNOB["method"].add_argument(p, choices=None, help=f"one of {', '.join(METHODS)}")
    add_tree_arguments(p)
    KNOB["temperature"].add_argument(p, help="0 = greedy")
    KNOB["top_p"].add_argument(p)
    KNOB["top_k_sampling"].add_argument(p, help="truncate the target's sampling distribution (0 = off)")
    KNOB["seed"].add_argument(p)
    KNOB["max_new_tokens"].add_argument(p)
    add_model_arguments(p)
    p.add_argument("--raw", action="store_true", help="use the prompt as is, without the chat template")
    p.add_argument("--jsonl", action="store_true", help="print each step record and the summary as JSON lines")


def auto_tree(engine, base: TreeConfig, say, lookup: int | None = None, probe_ms: dict | None = None):
    """The "auto" tree: adapted while decoding, from the kept profile of this machine. A
    profile kept for any thread count serves (scaled by ``probe_ms``, this start's thread
    probe: ``autotune.kept_cost_curve``), so a start beside a busy neighbour that picks
    another thread count than the profile's measures nothing. On the fast forward a first run
    with no profile at all measures one (the forward's cost curve and the head's acceptance:
    under a minute, said line by line, then kept), because there the right tree is much
    larger than the safe small chains; on the eager forward it is left to ``python -m app tune``."""
    # lazy: these load torch and transformers, which `generate --help` never needs
    from app.engine.adapt import adapter_for
    from app.engine.autotune import cost_curve_text, kept_cost_curve, profile_note
    from app.engine.rowwise import RowwiseLlamaDecoder

    measure = (isinstance(engine.decoder, RowwiseLlamaDecoder)
               and kept_cost_curve(engine.target, probe_ms=probe_ms) is None)
    if measure:
        say("no kept profile of this machine for the fast forward yet: measuring it once (under a minute)")
    start, adapter, choice = adapter_for(engine, base, measure=measure, progress=say, lookup=lookup,
                                         probe_ms=probe_ms)
    trees = ", ".join(adapter._key(t) for t in adapter.candidates)
    trees += " (total/depth/top_k)"
    if start.lookup:
        trees += f", each with a prompt-lookup branch of up to {start.lookup} tokens (--lookup 0: none)"
    if choice is None:
        say(f"adaptive tree over {trees}, starting at {TreeShape(start.total_tokens, start.depth, 1)}; "
            "no kept profile of this machine yet: `python -m app tune` measures it once")
    else:
        say(f"adaptive tree over {trees}, starting at the tuned "
            f"{TreeShape.of(start)}; {choice.summary()}")
        say(f"kept forward cost T(n): {cost_curve_text(choice.cost_curve.sizes, choice.cost_curve.ms)}")
        if note := profile_note(choice.cost_curve):
            say(f"kept profile: {note}")
    return start, adapter


def default_head(engine, args, say, probe_ms: dict | None):
    """The engine of the shipped head this machine's kept profile predicts faster
    (``app.engine.head_choice``): EAGLE-2's unless another shipped head is calibrated here and
    predicted faster. Says which, and why, when there is a choice."""
    from app.engine.factory import load_engine
    from app.engine.head_choice import choose_head, shipped_engines

    others = shipped_engines(engine, args.base_model,
                             lambda folder: load_engine(draft_model=str(folder), target=engine.target)[0])
    if not others:
        return engine
    choice = choose_head({DEFAULT_HEAD_KIND: engine, **others}, probe_ms)
    say(choice.text())
    return others.get(choice.name, engine)


def main(args) -> int:
    try:
        # every check that needs no model comes first, and none of them imports torch: bad
        # input is refused in a fraction of a second, not after ~10 s of imports and loading
        tree = tree_config_from(args)
        threads_from(args)
        sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p,
                                  top_k_sampling=args.top_k_sampling, seed=args.seed)
        check_prompt(args.prompt)
        check_max_new_tokens(args.max_new_tokens)
        check_before_loading(args.base_model, args.draft_model, args.device, head=tree.uses_head,
                             medusa=tree.method == "medusa", medusa_model=args.medusa_model)
        # lazy: transformers loads only once the arguments are good, and `generate --help`
        # loads neither it nor torch (0.3 s instead of ~20 s on a loaded 2-core CPU)
        from app.engine.factory import load_engine
        from app.engine.threads import engine_probe

        engine, _ = load_engine(args.base_model, args.draft_model, args.device, args.dtype,
                                head="required" if tree.uses_head else "none",
                                full_draft_vocab=args.full_draft_vocab,
                                medusa="required" if tree.method == "medusa" else "none",
                                medusa_model=args.medusa_model, forward=args.forward)
        say = lambda m: print(f"[auto] {m}", file=sys.stderr, flush=True)  # noqa: E731
        governor = thread_governor(args)
        governor.apply(engine_probe(engine))
        say(f"threads: {governor.text()}")
        adapter = None
        if wants_auto_tree(args) and args.draft_model in DEFAULTS:
            engine = default_head(engine, args, say, governor.probe_ms())
        if wants_auto_tree(args):
            tree, adapter = auto_tree(engine, tree, say, lookup=args.lookup, probe_ms=governor.probe_ms())
        events = governor.guard(engine.generate(args.prompt, tree=tree, sampling=sampling,
                                                max_new_tokens=args.max_new_tokens, raw=args.raw, adapt=adapter))
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
    if governor.fell_back:
        say(f"threads: {governor.text()}")
    if adapter is not None and not args.jsonl:
        used = ", ".join(f"{a['tree']} x{a['runs']} ({a['tokens_per_s']:.0f} tokens/s)" for a in adapter.summary() if a["runs"])
        say(f"trees used: {used}")
    return 0
