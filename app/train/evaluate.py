"""Stage *eval*: the head's mean accepted length tau on evaluation prompts, with the engine.

tau = new tokens per target forward, bonus included (EAGLE's "average acceptance length").
Acceptance by depth d pools all steps of all prompts: of the steps whose accepted path
reached depth d-1, the fraction that also accepted a token at depth d.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from app.engine import factory
from app.engine.config import SamplingConfig, TreeConfig, TreeShape
from app.train.data import log
from app.train.eagle3 import Eagle3Dataset, validate as validate_eagle3
from app.train.options import complete, parse_indices
from app.train.eval_overlap import EVAL_DIR
from app.train.trainer import FeatureDataset, validate as validate_eagle2


def first_turns(name: str, n: int | None, eval_dir: Path = EVAL_DIR, offset: int = 0) -> list[str]:
    """First user turns of an evaluation set: ``n`` of them from ``offset`` (None = all)."""
    rows = [json.loads(line) for line in (Path(eval_dir) / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows[offset:None if n is None else offset + n]]


def measure_tau(engine, prompts: list[str], tree: TreeConfig, sampling: SamplingConfig,
                max_new_tokens: int, progress=None) -> dict:
    """Run the engine on each prompt; pooled tau and acceptance by depth, plus each prompt's
    own counts (``per_prompt``), so that runs over parts of a set pool exactly (``pool``).
    ``new_tokens`` counts the tokens of the decoding steps (the prefill's first token, which
    every method gets alike, is left out), so tau = new_tokens / target_forwards.
    ``progress(done, total, tau_so_far)`` is called after each prompt."""
    per_prompt = []
    for i, prompt in enumerate(prompts):
        lengths: list[int] = []
        decoded = 0                    # tokens of the decoding steps (the prefill's first token is not one)
        for event in engine.generate(prompt, tree=tree, sampling=sampling, max_new_tokens=max_new_tokens):
            if getattr(event, "type", None) == "summary":
                per_prompt.append({"new_tokens": decoded, "target_forwards": event.target_forwards,
                                   "seconds": event.seconds})
            elif not event.prefill:
                decoded += len(event.new_tokens)
                lengths.append(len(event.accepted))
        counts = [sum(a == d for a in lengths) for d in range(tree.depth + 1)]   # steps accepting d drafts
        per_prompt[-1]["accepted_length_counts"] = counts
        if progress is not None:
            progress(i + 1, len(prompts), sum(p["new_tokens"] for p in per_prompt)
                     / max(1, sum(p["target_forwards"] for p in per_prompt)))
    return pool(per_prompt, tree.depth)


def pool(per_prompt: list[dict], depth: int) -> dict:
    """Pooled tau (new tokens / target forwards) and acceptance by depth d (of the steps whose
    accepted path reached depth d-1, the share that reached d) over per-prompt counts."""
    hist = [sum(p["accepted_length_counts"][d] for p in per_prompt) for d in range(depth + 1)]
    reached = [sum(hist[d:]) for d in range(depth + 1)]   # steps whose accepted path has >= d tokens
    by_depth = [reached[d] / reached[d - 1] if reached[d - 1] else 0.0 for d in range(1, depth + 1)]
    new_tokens = sum(p["new_tokens"] for p in per_prompt)
    forwards = sum(p["target_forwards"] for p in per_prompt)
    seconds = sum(p["seconds"] for p in per_prompt)
    return {"prompts": len(per_prompt), "tau": new_tokens / max(1, forwards), "accepted_by_depth": by_depth,
            "accepted_length_counts": hist,  # steps that accepted 0, 1, ..., depth drafted tokens
            "new_tokens": new_tokens, "target_forwards": forwards, "tokens_per_s": new_tokens / max(seconds, 1e-9),
            "per_prompt": per_prompt}


EVAL_SETS = ("mt_bench", "alpaca", "gsm8k", "humaneval", "qa", "sum")


def eval_tree(spec: str) -> TreeConfig:
    """``TOTAL/DEPTH/TOP_K`` -> the dynamic tree. Our depth counts drafted levels; the reference
    EAGLE-2 code takes the root's top-k as one level and then grows ``depth`` more, so its
    "depth 5" is our depth 6."""
    return TreeShape.parse(spec, "eval tree").config("dynamic")


def run_eval(args, head_dir: Path) -> dict:
    """tau and acceptance by depth at the papers' 60/5/10 tree (or ``--eval-tree``), for each
    set in ``--eval-set`` (comma-separated or 'all') at ``--eval-temperature``; one result per
    set, one model load.

    The engine drafts from the head's ``draft_vocab.json`` when the folder has one, as the CLI
    and the app do; ``--eval-full-draft-vocab`` drafts from the whole vocabulary instead (how
    releases 1-5 of the embedded head were measured)."""
    args = complete(args)
    engine, _ = factory.load_engine(args.base_model, str(head_dir), device=args.device, dtype="float32",
                                    full_draft_vocab=args.eval_full_draft_vocab)
    tree = eval_tree(args.eval_tree or "60/5/10")
    temperature = float(args.eval_temperature)
    sampling = SamplingConfig(temperature=temperature, seed=args.seed)
    names = EVAL_SETS if args.eval_set == "all" else [n.strip() for n in args.eval_set.split(",")]
    results = {}
    for name in names:
        if args.eval_indices:
            every = first_turns(name, None)
            prompts = [every[i] for i in parse_indices(args.eval_indices) if i < len(every)]
        else:
            prompts = first_turns(name, args.eval_prompts, offset=args.eval_offset)
        t0 = time.perf_counter()
        result = measure_tau(engine, prompts, tree, sampling, args.eval_new_tokens,
                             progress=lambda i, n, tau, name=name: log(
                                 f"eval {name}: {i}/{n} prompts, tau so far {tau:.3f}"))
        result.update({"set": name, "offset": args.eval_offset, "indices": args.eval_indices,
                       "tree": f"dynamic total_tokens={tree.total_tokens} depth={tree.depth} top_k={tree.top_k}",
                       "temperature": temperature, "draft_vocab": None if engine.draft_vocab is None else int(engine.draft_vocab.numel()),
                       "max_new_tokens": args.eval_new_tokens, "wall_s": time.perf_counter() - t0})
        log(f"eval: {json.dumps({k: v for k, v in result.items() if k != 'per_prompt'})}")
        results[name] = result
    if args.eval_out:
        Path(args.eval_out).write_text(json.dumps(results, indent=1) + "\n")
    return results


def pool_files(paths: list[str]) -> dict:
    """Pool ``--eval-out`` JSON files of runs over parts of the same sets (same tree and
    temperature), set by set: ``python -m app.train.evaluate part1.json part2.json``."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    out = {}
    for name in dict.fromkeys(n for r in runs for n in r):
        parts = [r[name] for r in runs if name in r]
        if len({(p["tree"], p["temperature"], p["max_new_tokens"], p.get("draft_vocab")) for p in parts}) != 1:
            raise ValueError(f"{name}: the runs differ in tree, temperature, length or draft vocabulary; "
                             "they do not pool")
        depth = len(parts[0]["accepted_by_depth"])
        out[name] = pool([pp for p in parts for pp in p["per_prompt"]], depth)
        out[name].update({k: parts[0].get(k) for k in ("tree", "temperature", "max_new_tokens", "draft_vocab")})
    return out


if __name__ == "__main__":
    import sys

    for name, r in pool_files(sys.argv[1:]).items():
        print(json.dumps({"set": name, **{k: v for k, v in r.items() if k != "per_prompt"}}))


def held_out_acceptance(head, target_model, shards: list[Path], depth: int = 5, vocab_ids=None,
                        max_batches: int | None = None) -> dict[str, float]:
    """acc_d (and the loss parts) by depth d = 1..``depth`` of a head of either kind on
    held-out feature shards: the share of response positions where the head, fed its own
    drafts for d-1 steps, puts the target's top token first over its draft vocabulary.
    An EAGLE-3 head reads the shards' target layers and drafts over its own vocabulary; an
    EAGLE-1/2 head over ``vocab_ids`` (its draft_vocab.json), or all tokens for None."""
    if getattr(head, "kind", "eagle2") == "eagle3":
        return validate_eagle3(head, target_model, Eagle3Dataset(shards), depth, head.draft_token_ids(),
                               max_batches=max_batches)
    return validate_eagle2(head, target_model, FeatureDataset(shards), steps=depth, max_batches=max_batches,
                           vocab_ids=vocab_ids)
