"""Stage *eval*: the head's mean accepted length tau on evaluation prompts, with the engine.

tau = new tokens per target forward, bonus included (EAGLE's "average acceptance length").
Acceptance by depth d pools all steps of all prompts: of the steps whose accepted path
reached depth d-1, the fraction that also accepted a token at depth d.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from app.engine.config import SamplingConfig, TreeConfig
from app.train.data import log
from app.train.prompts import EVAL_DIR


def first_turns(name: str, n: int | None, eval_dir: Path = EVAL_DIR, offset: int = 0) -> list[str]:
    """First user turns of an evaluation set: ``n`` of them from ``offset`` (None = all)."""
    rows = [json.loads(line) for line in (Path(eval_dir) / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows[offset:None if n is None else offset + n]]


def parse_indices(spec: str) -> list[int]:
    """"0-5,10,20" -> [0, 1, 2, 3, 4, 5, 10, 20]."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"bad index range {part!r}: use e.g. 0-5,10,20")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def measure_tau(engine, prompts: list[str], tree: TreeConfig, sampling: SamplingConfig,
                max_new_tokens: int) -> dict:
    """Run the engine on each prompt; pooled tau and acceptance by depth."""
    accepted_lengths: list[int] = []
    new_tokens = forwards = 0
    seconds = 0.0
    for prompt in prompts:
        for event in engine.generate(prompt, tree=tree, sampling=sampling, max_new_tokens=max_new_tokens):
            if getattr(event, "type", None) == "summary":
                new_tokens += event.new_tokens
                forwards += event.target_forwards
                seconds += event.seconds
            else:
                accepted_lengths.append(len(event.accepted))
    reached = [len(accepted_lengths)] + [sum(a >= d for a in accepted_lengths) for d in range(1, tree.depth + 1)]
    by_depth = [reached[d] / reached[d - 1] if reached[d - 1] else 0.0 for d in range(1, tree.depth + 1)]
    hist = [sum(a == d for a in accepted_lengths) for d in range(tree.depth + 1)]
    return {"prompts": len(prompts), "tau": new_tokens / max(1, forwards), "accepted_by_depth": by_depth,
            "accepted_length_counts": hist,  # steps that accepted 0, 1, ..., depth drafted tokens
            "new_tokens": new_tokens, "target_forwards": forwards, "tokens_per_s": new_tokens / max(seconds, 1e-9)}


EVAL_SETS = ("mt_bench", "alpaca", "gsm8k", "humaneval", "qa", "sum")


def eval_tree(spec: str) -> TreeConfig:
    """``TOTAL/DEPTH/TOP_K`` -> the dynamic tree. Our depth counts drafted levels; the reference
    EAGLE-2 code takes the root's top-k as one level and then grows ``depth`` more, so its
    "depth 5" is our depth 6."""
    parts = spec.split("/")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"eval tree must be TOTAL_TOKENS/DEPTH/TOP_K, e.g. 60/5/10, got {spec!r}")
    total, depth, top_k = (int(p) for p in parts)
    return TreeConfig(method="dynamic", depth=depth, top_k=top_k, total_tokens=total)


def run_eval(args, head_dir: Path) -> dict:
    """tau and acceptance by depth at the papers' 60/5/10 tree (or ``--eval-tree``), for each
    set in ``--eval-set`` (comma-separated or 'all') at ``--eval-temperature``; one result per
    set, one model load."""
    from app.engine.engine import Engine
    from app.engine.loading import load_draft_head, load_target

    target = load_target(args.base_model, device="cpu", dtype="float32")
    head = load_draft_head(str(head_dir), target)
    engine = Engine(target, head)
    tree = eval_tree(getattr(args, "eval_tree", None) or "60/5/10")
    temperature = float(getattr(args, "eval_temperature", 0.0))
    sampling = SamplingConfig(temperature=temperature, seed=args.seed)
    names = EVAL_SETS if args.eval_set == "all" else [n.strip() for n in args.eval_set.split(",")]
    results = {}
    for name in names:
        if getattr(args, "eval_indices", None):
            every = first_turns(name, None)
            prompts = [every[i] for i in parse_indices(args.eval_indices) if i < len(every)]
        else:
            prompts = first_turns(name, args.eval_prompts, offset=args.eval_offset)
        t0 = time.perf_counter()
        result = measure_tau(engine, prompts, tree, sampling, args.eval_new_tokens)
        result.update({"set": name, "offset": args.eval_offset, "indices": getattr(args, "eval_indices", None),
                       "tree": f"dynamic total_tokens={tree.total_tokens} depth={tree.depth} top_k={tree.top_k}",
                       "temperature": temperature,
                       "max_new_tokens": args.eval_new_tokens, "wall_s": time.perf_counter() - t0})
        log(f"eval: {json.dumps(result)}")
        results[name] = result
    if args.eval_out:
        Path(args.eval_out).write_text(json.dumps(results, indent=1) + "\n")
    return results
